"""A rank's process on its host: the hooks it starts with (die with the agent, pinned cores), what its exit
status and a signal's name mean here, and the one line that says why it could not be started.

Shipped with the agent: the standard library only, Python 3.7.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
from typing import Any

from launcher.agent.protocol import ERR, OUT, RankExited

# The rank's host, as the launcher names it (launcher/core/env.py's contract).
HOSTNAME_VAR = "DISTRUN_HOSTNAME"


def returncode_of(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def die_with_agent_hook() -> Any:
    """A pre-exec hook asking Linux to SIGKILL the rank if the agent dies, even by SIGKILL (None elsewhere).

    The agent normally stops its ranks itself; this covers the agent being killed outright (OOM killer,
    kill -9), which would otherwise leave the rank running unsupervised.
    """
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return hook


def pre_exec(die_with_agent: Any, cpus: list[int] | None) -> Any:
    """The rank's pre-exec hook: die with the agent, and run only on `cpus` (set before exec, so every thread
    the rank ever starts inherits them)."""
    if not cpus:
        return die_with_agent

    def hook() -> None:
        if die_with_agent is not None:
            die_with_agent()
        os.sched_setaffinity(0, cpus)

    return hook


def signal_number(name: str) -> int | None:
    """The local number of a signal sent by name (numbers differ between systems); None if unknown here."""
    number = getattr(signal, name, None) if name.startswith("SIG") and not name.startswith("SIG_") else None
    return int(number) if isinstance(number, int) else None


class RankProcess:
    """One rank's process on this host: its pipes, its process group, how and whether it ended."""

    def __init__(self, rank: int, proc: subprocess.Popen[bytes], started: float) -> None:
        self.rank = rank
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the rank leads its own process group
        self.started = started
        self.returncode: int | None = None
        self.stopped = False  # signalled by a stop while it still ran (RankExited.stopped)
        assert proc.stdout is not None and proc.stderr is not None
        self.fds = {proc.stdout.fileno(): OUT, proc.stderr.fileno(): ERR}
        self.files = {proc.stdout.fileno(): proc.stdout, proc.stderr.fileno(): proc.stderr}

    def reaped(self, now: float) -> RankExited | None:
        """Its exit once it has ended (None while it runs), with its wall time, CPU and peak memory."""
        # wait4, not poll(): the same reaping, plus the resource usage of the rank and what it waited for.
        try:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status, usage = -1, 0, None
        if pid == 0:
            return None
        if usage is None:  # reaped elsewhere (cannot happen in the agent, but Popen must not hang)
            code = self.proc.poll()
            exited = RankExited(
                -signal.SIGKILL if code is None else code, self.proc.pid, stopped=self.stopped
            )
        else:
            code = returncode_of(status)
            self.proc.returncode = code  # so Popen never waits for it again
            exited = RankExited(
                code,
                self.proc.pid,
                now - self.started,
                cpu_s=usage.ru_utime + usage.ru_stime,
                max_rss_kb=usage.ru_maxrss,  # KiB on Linux
                stopped=self.stopped,
            )
        self.returncode = exited.returncode
        return exited


def exec_problem(exc: OSError, argv: list[str]) -> str:
    """Why a command could not run, as a shell says it: `train: is a directory`, `x: Permission denied`
    (exec says EACCES for a directory too)."""
    program = exc.filename or (argv[0] if argv else "")
    if exc.errno == errno.EACCES and program and os.path.isdir(program):
        return f"{program}: is a directory"
    if exc.errno == errno.ENOENT and program and "/" not in program:
        return f"{program}: command not found"
    if exc.strerror:
        return f"{program}: {exc.strerror}" if program else exc.strerror
    return str(exc)


def start_failure(
    exc: OSError | subprocess.SubprocessError, argv: list[str], cpus: Any, rank: int, env: dict[str, str]
) -> tuple[int, str]:
    """The exit code (127: not found, else 126) and the line of a rank that could not be started."""
    code = 127 if isinstance(exc, FileNotFoundError) else 126
    # A failing pre-exec hook surfaces as SubprocessError; of ours, only the pinning can fail.
    reason = exec_problem(exc, argv) if isinstance(exc, OSError) else f"cannot pin it to cores {cpus}"
    # The host as the launcher names it (its summary says `localhost`, not this machine's name).
    host = env.get(HOSTNAME_VAR) or socket.gethostname()
    return code, f"distrun: cannot start rank {rank} on {host}: {reason}\n"
