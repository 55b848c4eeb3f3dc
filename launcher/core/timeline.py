"""Where start-up time went, per host: connected, agent started, probe answered, ranks started, first output.

Times are seconds since distrun started, on this machine's clock. Only the first time each phase happens
counts (a restart does not rewrite the start-up). `slowest` is what `-v` prints; `to_json` goes into
`--report`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from launcher.core.progress import Progress, ProgressFn

# Phases in order; "connected" and "agent" come from the SSH fan-out where it reports them apart (where it
# starts each host's agent as soon as its connection is up, "agent" alone); a local host has both at once.
PHASES = ("connected", "agent", "probed", "started")
_FAN_OUT_PHASES = {"connecting": "connected", "starting agents": "agent"}


@dataclass
class HostTimes:
    """When each start-up phase ended on one host, and when each of its ranks first wrote."""

    host: str
    marks: dict[str, float] = field(default_factory=dict)
    first_output: dict[int, float] = field(default_factory=dict)  # rank -> when it first wrote

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            **{phase: _round(self.marks.get(phase)) for phase in PHASES},
            "first_output": {str(rank): _round(t) for rank, t in sorted(self.first_output.items())},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class Timeline:
    def __init__(self, start: float) -> None:
        self.start = start
        self.hosts: dict[str, HostTimes] = {}

    def _host(self, host: str) -> HostTimes:
        return self.hosts.setdefault(host, HostTimes(host))

    def marks(self, host: str) -> dict[str, float]:
        return self._host(host).marks

    def mark(self, host: str, phase: str, now: float) -> None:
        self._host(host).marks.setdefault(phase, now - self.start)

    def wrote(self, rank: int, host: str, now: float) -> bool:
        """The rank wrote at `now`; True when this was its first output."""
        times = self._host(host)
        if rank in times.first_output:
            return False
        times.first_output[rank] = now - self.start
        return True

    def hook(self, progress: ProgressFn | None, clock: Any) -> ProgressFn:
        """`progress`, also marking each host's connection and agent start as the fan-out reports them."""

        def hooked(update: Progress) -> None:
            phase = _FAN_OUT_PHASES.get(update.phase)
            if phase is not None and update.host is not None:
                self.mark(update.host, phase, clock())
            if progress is not None:
                progress(update)

        return hooked

    def order(self, hosts: Iterable[str]) -> None:
        """List hosts in this order (the plan's): the fan-out marks them as they finish."""
        ordered = {host: self._host(host) for host in hosts}
        self.hosts = {**ordered, **self.hosts}

    def connected(self, hosts: Iterable[str], now: float) -> None:
        """The job's hosts are connected, in this order (the plan's). Those the fan-out did not report (this
        machine's): connected and agent up now."""
        hosts = list(hosts)
        self.order(hosts)
        for host in hosts:
            if "agent" not in self.marks(host):
                self.mark(host, "connected", now)
                self.mark(host, "agent", now)

    def to_json(self) -> list[dict[str, Any]]:
        return [times.to_json() for times in self.hosts.values()]


def slowest(hosts: Iterable[HostTimes]) -> list[str]:
    """Per phase, the host that reached it last: `probed: slowest h3 at 1.52s (fastest h1 at 0.31s)`."""
    hosts = list(hosts)
    lines = []
    phases: list[tuple[str, dict[str, float]]] = [
        (phase, {h.host: h.marks[phase] for h in hosts if phase in h.marks}) for phase in PHASES
    ]
    phases.append(("first output", {h.host: max(h.first_output.values()) for h in hosts if h.first_output}))
    for phase, times in phases:
        if not times:
            continue
        last = max(times, key=lambda h: times[h])
        line = f"start-up: {phase}: slowest {last} at {times[last]:.2f}s"
        if len(times) > 1:
            first = min(times, key=lambda h: times[h])
            line += f" (fastest {first} at {times[first]:.2f}s)"
        lines.append(line)
    return lines
