"""Which hosts a job leaves out, why, and until when (pure): the blacklist of an elastic job and of restarts.

A host is left out when it was lost, could not be reached, was named by --preflight, or its ranks failed (see
`launcher.core.restart` for when a failure counts). Without `--blacklist-cooldown-range` it stays out for the
rest of the job, as in Horovod. With `--blacklist-cooldown-range MIN MAX` it comes back after a cooldown that
doubles with each time it was left out, Horovod's backoff: `MIN * 2**count + jitter * MIN`, the jitter
drawn in [0, 1) by the caller, held within [MIN, MAX]. A host left out again while its cooldown runs keeps
that cooldown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Horovod's bounds on --blacklist-cooldown-range.
COOLDOWN_FLOOR = 1.0
COOLDOWN_CEILING = 3600.0


@dataclass(frozen=True)
class CooldownRange:
    """The shortest and longest time a left-out host waits before it may rejoin."""

    low: float
    high: float

    def seconds(self, count: int, jitter: float) -> float:
        """The cooldown of a host left out for the `count`th time (1 for the first)."""
        delay = self.low * (1 << count) + jitter * self.low
        return max(self.low, min(self.high, delay))


@dataclass(frozen=True)
class Exclusion:
    """A host left out: `until` is when it may come back (monotonic; None: for the rest of the job)."""

    host: str
    reason: str
    until: float | None
    count: int  # how many times this host was left out

    def line(self, now: float) -> str:
        """The console's line for it: who, why, for how long."""
        if self.until is None:
            span = "for the rest of the job"
        else:
            span = f"for {max(0.0, self.until - now):.0f}s (cooldown)"
        times = "" if self.count == 1 else f", left out {self.count} times"
        return f"leaving out host {self.host} {span}: {self.reason}{times}"


@dataclass
class Blacklist:
    """The hosts left out of an elastic job, each until its cooldown ends, and how often each was."""

    cooldown: CooldownRange | None = None
    excluded: dict[str, Exclusion] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, host: str, reason: str, now: float, jitter: float = 0.0) -> Exclusion:
        """Leave `host` out; the exclusion (a running cooldown is kept, not lengthened)."""
        current = self.excluded.get(host)
        if current is not None and (current.until is None or current.until > now):
            return current
        count = self.counts.get(host, 0) + 1
        self.counts[host] = count
        until = None if self.cooldown is None else now + self.cooldown.seconds(count, jitter)
        exclusion = Exclusion(host, reason, until, count)
        self.excluded[host] = exclusion
        return exclusion

    def usable(self, host: str, now: float) -> bool:
        exclusion = self.excluded.get(host)
        return exclusion is None or (exclusion.until is not None and exclusion.until <= now)

    def back_at(self, hosts: Iterable[str], now: float) -> float | None:
        """The earliest time one of `hosts` that is out now comes back (None: none of them will)."""
        ends = [
            e.until
            for name in hosts
            if (e := self.excluded.get(name)) is not None and e.until is not None and e.until > now
        ]
        return min(ends, default=None)
