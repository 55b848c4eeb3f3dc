"""Errors carry the exit code the CLI turns them into; nothing else maps errors to codes.

Exit codes (documented in README and, in full, docs/usage.md):
  0    every rank exited 0
  1    internal error in distrun itself
  2    bad input: options, hostfile, -H, config file
  3    a host could not be reached or failed preflight (nothing was started anywhere), or was lost mid-run
  4    every rank exited 0, but --report could not be written (none is left under its name)
  N    the first failing rank's exit code (128+S when it died of signal S; 126/127: it could not be started)
  124  --timeout expired
  130  stopped by SIGINT (Ctrl-C), 143 by SIGTERM, 129 by SIGHUP, 131 by SIGQUIT
"""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_HOST = 3
EXIT_REPORT = 4
EXIT_TIMEOUT = 124
EXIT_NOT_FOUND = 127
EXIT_SIGINT = 130


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15; `signal 40` for a number with no name (a real-time signal)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class DistrunError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code: int = EXIT_INTERNAL


class UsageError(DistrunError):
    """Bad options or arguments."""

    exit_code = EXIT_USAGE


class HostSpecError(UsageError):
    """A bad `-H` entry; the message names the offending token."""


class HostfileError(UsageError):
    """A bad hostfile line; the message starts with `PATH:LINE:`."""


class PlanError(UsageError):
    """The hosts cannot hold the requested processes."""


class SlurmEnvError(UsageError):
    """A Slurm variable distrun reads is malformed; the message names the variable and its value."""


class Interrupted(DistrunError):
    """A stopping signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) arrived before any rank started."""

    def __init__(self, signal_name: str, exit_code: int) -> None:
        super().__init__(f"interrupted by {signal_name} before any rank started")
        self.exit_code = exit_code

    @classmethod
    def from_signals(cls, received: bytes) -> Interrupted:
        """From the stopping signals' bytes of a signal wake-up pipe: SIGTERM if it is among them, else the
        first; exit code 128+N."""
        signum = signal.SIGTERM if signal.SIGTERM in received else received[0]
        return cls(signal_name(signum), 128 + signum)


class DeadlineReached(DistrunError):
    """`--timeout` expired while the job was between attempts or starting one (the supervisor handles it
    while ranks run); the attempt loop turns it into the job's TimedOut outcome."""

    exit_code = EXIT_TIMEOUT


class HostError(DistrunError):
    """A host was unreachable, refused us, or failed preflight; the message names the host.

    `host`: that host's name where one host is to blame (a restart may then go on without it).
    """

    exit_code = EXIT_HOST

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host


class CommandNotFound(DistrunError):
    """The script a `.py` command names is not on a host: exit 127, as a shell says for a missing command."""

    exit_code = EXIT_NOT_FOUND


class ReportWriteError(DistrunError):
    """The job succeeded but its --report could not be written at the end."""

    exit_code = EXIT_REPORT
