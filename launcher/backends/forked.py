"""This machine's agent as a forked copy of the launcher: no interpreter to start, nothing to import again.

A fresh interpreter for the local agent cost ~25 ms of every local job's start (interpreter, `dataclasses`,
`typing`, the protocol) and its teardown at the end; the launcher has all of that loaded already. The child
keeps the guarantees of a separately started agent: its own session (the terminal's Ctrl-C reaches only
distrun), the launcher's pipes as its only descriptors (so EOF on its stdin, the launcher's death included,
still reaches it), default signal dispositions, and an `os._exit` that never runs the launcher's clean-up.

Forking a process with threads can leave a lock held forever in the child, so the launcher forks only while
it is single-threaded (a first local launch) and starts an interpreter otherwise (`fork_safe`).

The launcher forks before its signal handling takes over, while Ctrl-C still raises KeyboardInterrupt. Raised
in one of the interpreter's at-fork callbacks (logging's), it would be printed as "Exception ignored" and
lost, and the job would run on: the stopping signals wait, blocked, until the fork is over.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import BinaryIO

from launcher.signals import STOP_SIGNALS


def fork_safe() -> bool:
    """Whether forking this process now cannot inherit a lock some other thread holds."""
    return threading.active_count() == 1


class ForkedAgent:
    """The child running `launcher.agent.server.main`, with the parts of `subprocess.Popen` that links use."""

    def __init__(self) -> None:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's coverage is not collected; tests observe it
                _child(in_r, out_w, err_w, mask)
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            self.pid = pid
            self.returncode: int | None = None
            self.stdin: BinaryIO = open(in_w, "wb", buffering=0)  # noqa: SIM115 - closed by the link
            self.stdout: BinaryIO = open(out_r, "rb", buffering=0)  # noqa: SIM115
            self.stderr: BinaryIO = open(err_r, "rb", buffering=0)  # noqa: SIM115
        finally:
            # A Ctrl-C that came meanwhile is raised from here; the agent sees EOF once these pipes are freed.
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Like Popen.wait: the exit code, or subprocess.TimeoutExpired after `timeout` seconds."""
        if timeout is None:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        import subprocess

        if self.poll() is None:
            _await_exit(self.pid, timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(["distrun agent"], timeout)
        return code

    def terminate(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def _await_exit(pid: int, timeout: float) -> None:
    """Until our child `pid` has ended (not reaped) or `timeout` seconds have passed, woken by the exit itself
    through a pidfd: the sleeps of a polling wait (`Popen.wait`'s, 0.5 ms doubling to 50 ms) were ~8 ms of
    every local job's end. Without pidfds (Linux before 5.3) it polls as Popen does."""
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def _child(in_r: int, out_w: int, err_w: int, mask: set[int | signal.Signals]) -> None:
    """Become the agent: own session, the three pipes as fds 0-2 and nothing else, default signals, the
    launcher's signal mask from before the fork."""
    code = 1
    try:
        os.setsid()
        for target, fd in ((0, in_r), (1, out_w), (2, err_w)):
            os.dup2(fd, target)
        # Every other descriptor is the launcher's: other agents' pipes (their EOF must not wait for us), log
        # files, the terminal.
        os.closerange(3, 1 << 20)
        signal.set_wakeup_fd(-1)
        for signum in signal.valid_signals():
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        from launcher.agent.server import main

        code = main()
    except BaseException:  # whatever happens, the child must not return into the launcher
        import traceback

        traceback.print_exc(file=sys.stderr)
    finally:
        os._exit(code)
