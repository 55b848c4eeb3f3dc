"""How a job ended: plain data shared by the supervisor, which fills it, and the summary, which reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StopReason = Literal["failure", "signal", "timeout", "host-lost"]


@dataclass(frozen=True)
class RankExit:
    rank: int
    host: str
    returncode: int

    @property
    def exit_code(self) -> int:
        """The shell convention: a death by signal N is 128+N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


@dataclass(frozen=True)
class RunResult:
    """`still_running`: the ranks that had not exited when the job began to stop (for any reason)."""

    exit_code: int
    reason: StopReason | None = None
    first_failure: RankExit | None = None
    signal_name: str | None = None
    still_running: tuple[int, ...] = ()
    lost_host: str | None = None
    lost_detail: str = ""
    timeout: float | None = None
