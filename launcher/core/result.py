"""How an attempt ended: one small type per kind of ending, each knowing its exit code and whether a restart
may help. Plain data shared by the supervisor, which makes them, the attempt loop and the summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from launcher.errors import EXIT_HOST, EXIT_OK, EXIT_TIMEOUT, signal_name


@dataclass(frozen=True)
class RankExit:
    """How one rank's process ended."""

    rank: int
    host: str
    returncode: int

    @property
    def exit_code(self) -> int:
        """The shell convention: a death by signal N is 128+N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


@dataclass(frozen=True)
class Succeeded:
    """Every rank exited 0."""

    name: ClassVar[str] = "succeeded"  # as the summary and --report (docs/report.schema.json) call it
    retryable: ClassVar[bool] = False
    exit_code: ClassVar[int] = EXIT_OK


@dataclass(frozen=True)
class RankFailed:
    """`stopped`: the ranks that were still running when the job began to stop (and so were stopped).
    `exited`: those that seemed to run still but had ended on their own (they exited at nearly the same
    time as the failing one), each with its own exit. `peers_done`: how many other ranks had exited 0 by
    then (all of them when `stopped` is empty)."""

    failure: RankExit
    stopped: tuple[int, ...] = ()
    exited: tuple[RankExit, ...] = ()
    peers_done: int = 0
    name: ClassVar[str] = "rank-failed"
    retryable: ClassVar[bool] = True

    @property
    def exit_code(self) -> int:
        return self.failure.exit_code


@dataclass(frozen=True)
class HostLost:
    """`ours`: the host is not to blame; distrun itself did not run (stopped, say) for longer than its agents
    wait for it, so they stopped their ranks."""

    host: str
    detail: str
    stopped: tuple[int, ...] = ()
    ours: bool = False
    name: ClassVar[str] = "host-lost"
    retryable: ClassVar[bool] = True
    exit_code: ClassVar[int] = EXIT_HOST


@dataclass(frozen=True)
class Signalled:
    """The user (or the system) stopped the job: never restarted."""

    signum: int
    stopped: tuple[int, ...] = ()
    name: ClassVar[str] = "signalled"
    retryable: ClassVar[bool] = False

    @property
    def signal_name(self) -> str:
        return signal_name(self.signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass(frozen=True)
class TimedOut:
    """--timeout ran out; `stopped`: the ranks still running then."""

    timeout: float
    stopped: tuple[int, ...] = ()
    name: ClassVar[str] = "timed-out"
    retryable: ClassVar[bool] = False
    exit_code: ClassVar[int] = EXIT_TIMEOUT


Outcome = Succeeded | RankFailed | HostLost | Signalled | TimedOut


def describe_exit(ended: RankExit) -> str:
    if ended.returncode < 0:
        return f"was killed by {signal_name(-ended.returncode)} (exit code {ended.exit_code})"
    return f"exited with code {ended.returncode}"
