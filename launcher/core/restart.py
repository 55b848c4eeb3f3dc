"""Whether a finished attempt is followed by another, and on which hosts (pure).

A non-retryable outcome (success, a signal, the timeout) ends the job; so does a retryable one once the
restarts are used up. Otherwise the job restarts on the same hosts, or, when elastic (`--min-np`), without the
hosts that were lost or failed twice in a row (each sits out a cooldown) and with the hosts discovery found,
as long as at least `min_np` ranks fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.core.config import RestartOptions
from launcher.core.hosts import Host
from launcher.core.plan import plural
from launcher.core.result import HostLost, Outcome, RankFailed, Signalled, TimedOut, describe_exit

# A host whose ranks fail this many attempts in a row is left out, as a lost one is.
FAILURES_TO_EXCLUDE = 2


@dataclass(frozen=True)
class Restart:
    hosts: tuple[Host, ...]
    num_proc: int
    reason: str


@dataclass(frozen=True)
class GiveUp:
    """The job ends with the attempt's outcome; `message` says why no restart follows, if there is a why."""

    message: str | None = None
    below_min_np: bool = False


@dataclass
class HostBook:
    """What the attempts taught about hosts: who sits out until when, who failed how often in a row."""

    excluded_until: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    def learn(self, outcome: Outcome, now: float, cooldown: float) -> str | None:
        """Record the outcome; returns the host it excludes, if any."""
        if isinstance(outcome, HostLost):
            if outcome.ours:
                return None  # distrun's own silence: the host did nothing wrong
            self.excluded_until[outcome.host] = now + cooldown
            return outcome.host
        if isinstance(outcome, RankFailed):
            host = outcome.failure.host
            self.failures = {host: self.failures.get(host, 0) + 1}
            if self.failures[host] >= FAILURES_TO_EXCLUDE:
                self.excluded_until[host] = now + cooldown
                return host
        return None

    def usable(self, host: Host, now: float) -> bool:
        return self.excluded_until.get(host.name, now) <= now


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
) -> Restart | GiveUp:
    """What follows the attempt that ended with `outcome`, run on `hosts` with `num_proc` ranks."""
    if not outcome.retryable:
        return GiveUp()
    if restarts_done >= options.max_restarts:
        if options.max_restarts == 0:
            return GiveUp()
        return GiveUp(f"no restarts left ({plural(options.max_restarts, 'restart', 'restarts')} used)")
    reason = cause(outcome)
    if not options.elastic:
        return Restart(tuple(hosts), num_proc, reason)
    assert options.min_np is not None and options.max_np is not None
    left_out = book.learn(outcome, now, options.cooldown)
    names = {h.name for h in hosts}
    candidates = [h for h in hosts if book.usable(h, now)]
    candidates += [h for h in discovered if h.name not in names and book.usable(h, now)]
    slots = sum(h.slots for h in candidates)
    if slots < options.min_np:
        without = f" without {left_out}" if left_out else ""
        return GiveUp(
            f"only {plural(slots, 'slot', 'slots')} left{without} "
            f"({', '.join(h.name for h in candidates) or 'no hosts'}), fewer than --min-np {options.min_np}",
            below_min_np=True,
        )
    return Restart(tuple(candidates), min(slots, options.max_np), reason)
