"""What a phase of a fan-out reports as it goes (`Progress`), and the deadline that follows it.

Plain values: backends, the host runtime and the workdir sync report through a `ProgressFn`; the console
draws it (`launcher.console.progress`) and the start-up timeline records it (`launcher.core.timeline`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Progress:
    """One phase of a fan-out: `done` hosts finished it, `failed` gave up, out of `total`; `host`: the one
    whose result this update reports, if any."""

    phase: str
    total: int
    done: int = 0
    failed: int = 0
    host: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        text = f"{self.phase} {self.done}/{self.total} hosts"
        return f"{text}, {self.failed} failed" if self.failed else text


ProgressFn = Callable[[Progress], None]


class StallDeadline:
    """A deadline that follows progress: it passes only when nothing progressed for `stall` seconds.

    A fixed timeout either fails large fan-outs that are merely slow (hundreds of agents starting on busy
    hosts) or waits far too long for a dead host in a small one; this one keeps going while results keep
    arriving and names a silent host `stall` seconds after the last sign of progress.
    """

    def __init__(self, stall: float, now: float) -> None:
        self.stall = stall
        self.at = now + stall

    def progressed(self, now: float) -> None:
        self.at = now + self.stall

    def remaining(self, now: float) -> float:
        return self.at - now
