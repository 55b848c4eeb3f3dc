"""Whether a finished attempt is followed by another, and on which hosts (pure).

A non-retryable outcome (success, a signal, the timeout) ends the job; so does a retryable one once the
restarts are used up. Otherwise the job restarts without the hosts it left out (`launcher.core.blacklist`: a
lost host at once, a host whose ranks failed in two attempts in a row) and with spare hosts in their place:
hosts of -H/--hostfile beyond the slots in use, then (elastic) hosts discovery found. A fixed-size job keeps
its size, and where no spare is free it restarts on the same hosts as before; an elastic one (`--min-np`)
goes on with the slots it has, up to `--max-np`, as long as at least `min_np` ranks fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.core.blacklist import Blacklist, Exclusion
from launcher.core.config import RestartOptions
from launcher.core.hosts import Host
from launcher.core.plan import plural
from launcher.core.result import HostLost, Outcome, RankFailed, Signalled, TimedOut, describe_exit

# A host whose ranks fail this many attempts in a row is left out, as a lost one is. A whole-job restart
# replays the same code on every host, so one failure says little about the host it happened on (a reset in
# place leaves a failed rank's host out at once, as Horovod does: docs/elastic.md).
FAILURES_TO_EXCLUDE = 2


@dataclass(frozen=True)
class Restart:
    """The job runs another attempt on `hosts`, with `num_proc` ranks."""

    hosts: tuple[Host, ...]
    num_proc: int
    reason: str
    note: str | None = None  # a line to say before the restart (a fixed-size job that found no spare)


@dataclass(frozen=True)
class GiveUp:
    """The job ends with the attempt's outcome; `message` says why no restart follows, if there is a why.
    `back_at`: when a host left out comes back (monotonic), for a job that may wait for it
    (--elastic-timeout)."""

    message: str | None = None
    below_min_np: bool = False
    back_at: float | None = None


@dataclass
class HostBook:
    """What the attempts taught about hosts: who is left out (and until when), who failed how often in a
    row."""

    blacklist: Blacklist = field(default_factory=Blacklist)
    failures: dict[str, int] = field(default_factory=dict)

    def learn(self, outcome: Outcome, now: float, jitter: float = 0.0) -> Exclusion | None:
        """Record the outcome; the exclusion it makes, if any."""
        if isinstance(outcome, HostLost):
            if outcome.ours:
                return None  # distrun's own silence: the host did nothing wrong
            return self.blacklist.add(outcome.host, f"lost ({outcome.detail})", now, jitter)
        if isinstance(outcome, RankFailed):
            failed = outcome.failure
            return self.rank_failed(failed.host, f"rank {failed.rank} {describe_exit(failed)}", now, jitter)
        return None

    def rank_failed(self, host: str, what: str, now: float, jitter: float = 0.0) -> Exclusion | None:
        """A rank on `host` failed (`what`: which, how), ending an attempt or absorbed by a reset in place;
        the exclusion once that is the FAILURES_TO_EXCLUDE-th failure in a row there."""
        self.failures = {host: self.failures.get(host, 0) + 1}
        if self.failures[host] < FAILURES_TO_EXCLUDE:
            return None
        reason = f"its ranks failed {self.failures[host]} times in a row (last: {what})"
        return self.blacklist.add(host, reason, now, jitter)

    def usable(self, host: Host, now: float) -> bool:
        return self.blacklist.usable(host.name, now)


def cause(outcome: Outcome) -> str:
    """The attempt's outcome in a few words, for the restart line and the summary of attempts."""
    if isinstance(outcome, RankFailed):
        return f"rank {outcome.failure.rank} (host {outcome.failure.host}) {describe_exit(outcome.failure)}"
    if isinstance(outcome, HostLost):
        if outcome.ours:
            return f"host {outcome.host} stopped its ranks ({outcome.detail})"
        return f"lost host {outcome.host} ({outcome.detail})"
    if isinstance(outcome, TimedOut):
        return f"timed out after {outcome.timeout:g}s"
    if isinstance(outcome, Signalled):
        return f"stopped by {outcome.signal_name}"
    return outcome.name


def decide(
    outcome: Outcome,
    *,
    restarts_done: int,
    options: RestartOptions,
    hosts: Sequence[Host],
    num_proc: int,
    book: HostBook,
    now: float,
    discovered: Sequence[Host] = (),
    spares: Sequence[Host] = (),
    jitter: float = 0.0,
) -> Restart | GiveUp:
    """What follows the attempt that ended with `outcome`, run on `hosts` with `num_proc` ranks; `spares`:
    the other hosts of -H/--hostfile, in their order."""
    if not outcome.retryable:
        return GiveUp()
    if restarts_done >= options.max_restarts:
        if options.max_restarts == 0:
            return GiveUp()
        return GiveUp(f"no restarts left ({plural(options.max_restarts, 'restart', 'restarts')} used)")
    reason = cause(outcome)
    left_out = book.learn(outcome, now, jitter)
    return plan_restart(
        reason, left_out.host if left_out else None, options=options, hosts=hosts, num_proc=num_proc,
        book=book, now=now, discovered=discovered, spares=spares,
    )  # fmt: skip


def plan_restart(
    reason: str,
    left_out: str | None,
    *,
    options: RestartOptions,
    hosts: Sequence[Host],
    num_proc: int,
    book: HostBook,
    now: float,
    discovered: Sequence[Host] = (),
    spares: Sequence[Host] = (),
) -> Restart | GiveUp:
    """The next attempt's hosts and size from what `book` knows now (decided again while an elastic job
    waits for --min-np slots): the usable hosts of the last attempt in their order, then usable spares, then
    (elastic) usable discovered hosts."""
    candidates: list[Host] = []
    for host in [*hosts, *spares, *(discovered if options.elastic else ())]:
        if book.usable(host, now) and all(host.name != h.name for h in candidates):
            candidates.append(host)
    slots = sum(h.slots for h in candidates)
    if not options.elastic:
        if slots >= num_proc:
            return Restart(tuple(candidates), num_proc, reason)
        # A fixed-size job never shrinks: without a spare for what was left out, the same hosts again.
        note = f"no spare host free for {left_out}: restarting on the same hosts" if left_out else None
        return Restart(tuple(hosts), num_proc, reason, note)
    assert options.min_np is not None and options.max_np is not None
    if slots < options.min_np:
        from launcher.core.elastic_policy import too_few  # an elastic job's policy: not on a plain job's path

        known = [h.name for h in (*hosts, *spares, *discovered)]
        return GiveUp(
            too_few(slots, options.min_np, [h.name for h in candidates], without=left_out or ""),
            below_min_np=True,
            back_at=book.blacklist.back_at(known, now),
        )
    return Restart(tuple(candidates), min(slots, options.max_np), reason)
