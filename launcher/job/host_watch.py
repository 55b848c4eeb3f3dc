"""`--host-discovery-script` polled every second while an elastic attempt runs (docs/elastic.md).

Part of the running attempt's phase (the Supervisor ticks it): the script runs as a child whose stdout the
job's loop reads, so the loop never waits for it. When the hosts it lists change and every rank uses
`hvd.elastic`, the change is a planned reset (launcher.job.elastic.Resetter.change_hosts): every rank hears
`hosts_updated` and raises HostsUpdatedInterrupt at its next commit; the ranks of removed hosts leave (exit
0), newcomers start on added hosts (connected and probed first) up to --max-np, the others go on with new
identities. Who stays and who comes is `launcher.core.host_changes`.

A script that fails at its first call ends the job (DiscoveryError, exit 2); a later failure is logged and
the script runs again a second later.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.console.progress import progress_line
from launcher.core.host_changes import hosts_update, regroup
from launcher.core.hosts import Host
from launcher.core.plan import plural
from launcher.errors import EXIT_INTERNAL, DistrunError
from launcher.job.discovery import TIMEOUT, DiscoveryError, Polling
from launcher.job.elastic import Resetter
from launcher.runtime.node import HostAttempt, connect

if TYPE_CHECKING:
    from launcher.core.plan import Plan
    from launcher.job.run import Job
    from launcher.job.supervise import Supervisor

log = logging.getLogger(__name__)

EVERY = 1.0  # Horovod's driver polls its discovery script every second

# Connects to and probes the hosts a change added; those that could not be reached are left out.
Join = Callable[[Sequence[Host]], list[HostAttempt]]


class ResetLimitReached(DistrunError):
    """A hosts update would begin the (N+1)th reset: the job ends, naming the limit."""

    exit_code = EXIT_INTERNAL


class HostWatch:
    """The script's runs during one attempt, and the hosts the world was last formed with (`known`)."""

    def __init__(
        self,
        script: Path,
        known: Sequence[Host],
        resetter: Resetter,
        join: Join,
        *,
        max_np: int,
        slots_per_host: int | None = None,
        called_before: bool = False,
        every: float = EVERY,
    ) -> None:
        """`called_before`: the script already answered once (it named the job's first hosts), so no failure
        of it ends the job."""
        self.script = script
        self.known = tuple(known)
        self.resetter = resetter
        self.join = join
        self.max_np = max_np
        self.slots_per_host = slots_per_host
        self.answered = called_before
        self.every = every
        self.sup: Supervisor | None = None
        self.polling: Polling | None = None
        self.next_at = time.monotonic() + every
        self.latest: tuple[Host, ...] | None = None
        self.wake = False  # a run ended: its result is taken at the loop's next pass
        # Added hosts that could not be joined, left out while the script lists them.
        self.unreachable: set[str] = set()
        self.said: str | None = None  # the last reason an update waits, said once
        self.fatal: DistrunError | None = None  # what ends the job, once its ranks are stopped
        self.changed = False  # a hosts update formed a new world: `known` are the job's hosts now

    def attach(self, sup: Supervisor) -> None:
        self.sup = sup

    def next_due(self) -> float:
        if self.wake:
            return time.monotonic()
        return self.polling.end if self.polling is not None else self.next_at

    def _readable(self, now: float) -> bool:
        assert self.polling is not None
        more = self.polling.on_readable(now)
        self.wake = not more
        return more

    def tick(self, now: float) -> None:
        self.wake = False
        polling = self.polling
        if polling is not None:
            polling.check(now)
            if polling.finished:
                polling.close()
                self.polling = None
                self.next_at = now + self.every
                self._take(polling)
        if self.polling is None and now >= self.next_at and self.sup is not None:
            try:
                self.polling = Polling(self.script, TIMEOUT, self.slots_per_host)
            except DiscoveryError as err:
                self._failed(err)
                self.next_at = now + self.every
            else:
                self.sup.add_watch(self.polling.stdout, self._readable)
        self._apply(now)

    def _take(self, polling: Polling) -> None:
        if polling.error is not None:
            self._failed(polling.error)
            return
        self.answered = True
        self.latest = polling.hosts
        self.unreachable &= {host.name for host in polling.hosts}

    def _failed(self, error: DiscoveryError) -> None:
        if not self.answered:
            self._end(DiscoveryError(f"{error} (its first call: the job ends)"), time.monotonic())
            return
        log.warning("%s; running it again in %gs", error, self.every)

    def _end(self, error: DistrunError, now: float) -> None:
        """Every rank is stopped; the job raises `error` once they are (launcher.job.run)."""
        self.fatal = error
        self.latest = None
        assert self.sup is not None
        self.sup.end_job(now)

    def _apply(self, now: float) -> None:
        """Form the new world when the hosts changed, no reset is under way and every rank opted in."""
        resetter = self.resetter
        if self.latest is None or resetter.resetting:
            return
        # A host whose ranks all left runs no attempt any more: listed again, it joins at the next restart.
        done = {name for name, host in resetter.hosts.items() if host.finished}
        hosts = tuple(host for host in self.latest if host.name not in self.unreachable | done)
        update = hosts_update([host for host in self.known if host.name not in done], hosts)
        if update is None:
            return
        members = resetter.members()
        if not all(rank_id in resetter.opted for rank_id, _ in members):
            self._wait_because(f"{update.cause}: waiting until every rank uses hvd.elastic", logging.INFO)
            return
        failed = Counter(resetter.host_of[rank_id] for rank_id in resetter.failed)
        regrouped = regroup(members, hosts, self.max_np, failed)
        if not regrouped.leaving and not regrouped.newcomers:
            # Added slots beyond --max-np: spares, no reset (an agent with no rank would hold the attempt); a
            # later loss leaves room for them.
            self._wait_because(f"{update.cause}: no rank to start (--max-np {self.max_np})", logging.INFO)
            return
        refusal = resetter.change_hosts(update.cause, update.kind, regrouped, now)
        if refusal is None:
            # The ranks heard of it and go on to their next commit while the added hosts are reached.
            self.known = hosts
            self.changed = True
            self.said = None
            coming = {host.name for host in regrouped.newcomers}
            self._join([h for h in hosts if h.name in coming and h.name not in resetter.hosts])
            return
        if refusal.startswith("--reset-limit"):
            self._end(ResetLimitReached(f"the job ends: {refusal}; the next: {update.cause}"), now)
            return
        self._wait_because(f"{update.cause}: no reset in place: {refusal}")

    def _join(self, new: Sequence[Host]) -> None:
        """Connect to and probe the added hosts; the newcomers of those that could not be reached do not come,
        and the hosts stay out while the script lists them."""
        if not new:
            return
        joined = self.join(new)
        assert self.sup is not None
        for host in joined:
            self.sup.add_host(host)
            self.resetter.add_host(host)
        missing = {host.name for host in new} - {host.name for host in joined}
        if missing:
            self.unreachable |= missing
            self.known = tuple(host for host in self.known if host.name not in missing)
            self.resetter.drop_newcomers(missing)

    def _wait_because(self, why: str, level: int = logging.WARNING) -> None:
        if why != self.said:
            self.said = why
            log.log(level, "%s", why)

    def close(self) -> None:
        if self.polling is not None:
            self.polling.close()
            self.polling = None


def join_hosts(
    job: Job, new: Sequence[Host], hosts: list[HostAttempt], master_addr: str
) -> list[HostAttempt]:
    """Connect to the hosts an update added and probe them (the job's loop waits meanwhile, as between
    attempts); each joins the attempt's `hosts`. None of them when they could not all be reached (named)."""
    control = job.watch.control if job.watch is not None else None
    names = ", ".join(host.name for host in new)
    try:
        with progress_line(sys.stderr) as line:
            fresh = connect(
                new, job.config, line, control=control,
                doing=f"adding {plural(len(new), 'host', 'hosts')}: connecting",
            )  # fmt: skip
    except DistrunError as err:
        log.warning("cannot add %s: %s", names, err)
        return []
    job.heartbeat.add(fresh)
    job.nodes.update((node.name, node) for node in fresh)
    joined = [HostAttempt(node, (), idle=True) for node in fresh]  # waited for once it holds ranks
    try:
        job.probe(joined, master_addr)
        if job.workdir is not None:
            job.copies.update(job.sync(fresh, job.workdir))
        job.same_software([*hosts, *joined])
    except DistrunError as err:
        log.warning("cannot add %s: %s", names, err)
        for node in fresh:
            job.nodes.pop(node.name, None)
            node.drop()
        return []
    hosts.extend(joined)
    return joined


def watch_hosts(
    job: Job, plan: Plan, hosts: list[HostAttempt], elastic: Resetter | None, master_addr: str
) -> HostWatch | None:
    """An elastic attempt's --host-discovery-script, polled while its ranks run; None without one."""
    options = job.config.restart
    if elastic is None or options.discovery_script is None:
        return None
    return HostWatch(
        options.discovery_script, plan.nodes, elastic, lambda new: join_hosts(job, new, hosts, master_addr),
        max_np=options.max_np or plan.world_size, slots_per_host=options.slots_per_host,
        called_before=options.discovered_first or bool(job.attempts),
    )  # fmt: skip
