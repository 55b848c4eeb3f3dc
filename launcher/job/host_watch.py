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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from launcher.core.config import RestartOptions
from launcher.core.host_changes import hosts_update, regroup
from launcher.core.hosts import Host
from launcher.core.plan import Plan
from launcher.errors import EXIT_INTERNAL, DistrunError
from launcher.job.attempt_hosts import AttemptHosts
from launcher.job.discovery import TIMEOUT, DiscoveryError, Polling
from launcher.runtime.node import HostAttempt

if TYPE_CHECKING:
    from launcher.job.elastic import Resetter

log = logging.getLogger(__name__)

EVERY = 1.0  # Horovod's driver polls its discovery script every second

# Connects to and probes the hosts a change added; those that could not be reached or were refused are left
# out (launcher.job.attempt_hosts).
Join = Callable[[Sequence[Host]], list[HostAttempt]]
# A host of the attempt whose ranks all ended, back after its cooldown: its new record (None: it cannot).
Revive = Callable[[str], HostAttempt | None]


class Attached(Protocol):
    """What the watch asks of the running attempt's phase (launcher.job.supervise.Supervisor)."""

    def end_job(self, now: float) -> None: ...

    def add_watch(self, fileobj: IO[Any], on_ready: Callable[[float], bool]) -> None: ...


class ResetLimitReached(DistrunError):
    """A hosts update would begin the (N+1)th reset: the job ends, naming the limit."""

    exit_code = EXIT_INTERNAL


class HostWatch:
    """The script's runs during one attempt, and the hosts the world was last formed with (`known`)."""

    def __init__(
        self,
        script: Path | None,
        known: Sequence[Host],
        resetter: Resetter,
        join: Join,
        *,
        max_np: int,
        slots_per_host: int | None = None,
        called_before: bool = False,
        every: float = EVERY,
        usable: Callable[[str], bool] = lambda host: True,
        revive: Revive = lambda host: None,
        exclusions: Callable[[str], int] = lambda host: 0,
    ) -> None:
        """`script` None: the job's hosts are fixed (-H), and the watch only brings back a host left out
        once its cooldown ends. `called_before`: the script already answered once (it named the job's first
        hosts), so no failure of it ends the job. `usable(host)`: not on the blacklist now;
        `exclusions(host)`:
        how many times the blacklist left it out. A host left out since the world was formed is out of the
        world's hosts, however short its cooldown: once usable again it comes back as an addition."""
        self.script = script
        self.known = tuple(known)
        self.resetter = resetter
        self.join = join
        self.max_np = max_np
        self.slots_per_host = slots_per_host
        self.answered = called_before
        self.every = every
        self.sup: Attached | None = None
        self.polling: Polling | None = None
        self.next_at = time.monotonic() + every
        self.latest: tuple[Host, ...] | None = None if script is not None else self.known
        self.usable = usable
        self.revive = revive
        self.out: set[str] = set()  # hosts of the world the blacklist left out since it was formed
        self.exclusions = exclusions
        self.seen = {host.name: exclusions(host.name) for host in self.known}
        self.wake = False  # a run ended: its result is taken at the loop's next pass
        # Added hosts that could not be joined, left out while the script lists them.
        self.unreachable: set[str] = set()
        self.said: str | None = None  # the last reason an update waits, said once
        self.fatal: DistrunError | None = None  # what ends the job, once its ranks are stopped
        self.changed = False  # a hosts update formed a new world: `known` are the job's hosts now

    def attach(self, sup: Attached) -> None:
        self.sup = sup

    def next_due(self) -> float:
        if self.wake:
            return time.monotonic()
        return self.polling.end if self.polling is not None else self.next_at

    @property
    def polls(self) -> bool:
        return self.script is not None

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
        if self.script is None and now >= self.next_at:
            self.next_at = now + self.every  # no script: the blacklist's clocks are looked at each second
        elif self.script is not None and self.polling is None and now >= self.next_at and self.sup:
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
        # A host left out is out of the world's hosts: when its time is up (and the script, if any, lists it)
        # it comes back as an addition. A host left out for the rest of the job never does.
        self.out |= {h.name for h in self.known if self.exclusions(h.name) > self.seen.get(h.name, 0)}
        self.known = tuple(host for host in self.known if host.name not in self.out)
        # A host whose ranks all ended runs no attempt any more: one left out comes back on a new record,
        # others (their ranks left, or finished) at the next restart.
        done = {name for name, host in resetter.hosts.items() if host.finished}
        hosts = tuple(
            host
            for host in self.latest
            if host.name not in self.unreachable
            and self.usable(host.name)
            and (host.name not in done or host.name in self.out)
        )
        source = "--host-discovery-script" if self.polls else "a cooldown ended"
        update = hosts_update([host for host in self.known if host.name not in done], hosts, source)
        if update is None:
            return
        members = resetter.members()
        if not all(rank_id in resetter.opted for rank_id, _ in members):
            self._wait_because(f"{update.cause}: waiting until every rank uses hvd.elastic", logging.INFO)
            return
        back = [name for name in update.added if name in done]
        spent = resetter.spent()
        for name in back:
            del spent[name]  # back from its cooldown: its failed ranks' slots are free again
        regrouped = regroup(members, hosts, self.max_np, spent)
        if not regrouped.leaving and not regrouped.newcomers:
            # Added slots beyond --max-np: spares, no reset (an agent with no rank would hold the attempt); a
            # later loss leaves room for them.
            self._wait_because(f"{update.cause}: no rank to start (--max-np {self.max_np})", logging.INFO)
            return
        coming = {host.name for host in regrouped.newcomers}
        # The added hosts are reached, probed and admitted before any rank hears of the change: a host
        # refused costs no reset (it is left out while the script lists it, and the change made again).
        if not self._join([h for h in hosts if h.name in coming], done):
            return
        for name in back:
            resetter.host_back(name)
        refusal = resetter.change_hosts(update.cause, update.kind, regrouped, now)
        if refusal is None:
            self.known = hosts
            resetter.listed([host.name for host in hosts])
            self.out -= {host.name for host in hosts}
            self.seen = {host.name: self.exclusions(host.name) for host in hosts}
            self.changed = True
            self.said = None
            return
        if refusal.startswith("--reset-limit"):
            self._end(ResetLimitReached(f"the job ends: {refusal}; the next: {update.cause}"), now)
            return
        self._wait_because(f"{update.cause}: no reset in place: {refusal}")

    def _join(self, coming: Sequence[Host], done: set[str]) -> bool:
        """The hosts newcomers go to, ready for them: added ones connected, probed and admitted, ones whose
        ranks all ended given a new record. False when one could not be (it stays out while listed)."""
        # Each record joined or revived is the Supervisor's and the driver's from then on (AttemptHosts.added)
        again: set[str] = set()  # lost, back from a cooldown: reached again as an added host is
        for name in dict.fromkeys(h.name for h in coming if h.name in done):
            if self.revive(name) is None:
                again.add(name)
        new = [h for h in dict.fromkeys(coming) if h.name not in self.resetter.hosts or h.name in again]
        missing = {h.name for h in new} - {h.name for h in self.join(new)}
        if missing:
            self.unreachable |= missing
            return False
        return True

    def _wait_because(self, why: str, level: int = logging.WARNING) -> None:
        if why != self.said:
            self.said = why
            log.log(level, "%s", why)

    def close(self) -> None:
        if self.polling is not None:
            self.polling.close()
            self.polling = None


def watch_hosts(
    options: RestartOptions,
    plan: Plan,
    elastic: Resetter | None,
    hosts: AttemptHosts,
    usable: Callable[[str], bool],
    *,
    exclusions: Callable[[str], int],
    called_before: bool,
) -> HostWatch | None:
    """An elastic attempt's watch of its hosts: the --host-discovery-script polled while its ranks run, or
    (fixed hosts with --blacklist-cooldown-range) a host left out brought back once its cooldown ends; None
    where neither applies. `called_before`: an earlier attempt ran (the script answered then)."""
    script = options.discovery_script
    if elastic is None or (script is None and options.cooldown_range is None):
        return None
    return HostWatch(
        script, plan.nodes, elastic, hosts.join, max_np=options.max_np or plan.world_size,
        slots_per_host=options.slots_per_host, called_before=options.discovered_first or called_before,
        usable=usable, revive=hosts.revive, exclusions=exclusions,
    )  # fmt: skip
