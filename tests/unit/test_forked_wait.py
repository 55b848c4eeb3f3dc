"""The forked local agent's timed wait (launcher/backends/forked.py): woken by the child's exit, not by
polling, and on systems without pidfds by polling as Popen does."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from launcher.backends.forked import _await_exit

# Ends when its stdin closes.
UNTIL_EOF = [sys.executable, "-c", "import sys; sys.stdin.read()"]


@pytest.fixture(params=["pidfd", "polling"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "polling":

        def no_pidfd(pid: int) -> int:
            raise OSError("no pidfd here")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("this Python has no os.pidfd_open")
    return str(request.param)


def test_it_returns_once_the_child_ended_and_leaves_it_to_be_reaped(way: str) -> None:
    child = subprocess.Popen(UNTIL_EOF, stdin=subprocess.PIPE)
    assert child.stdin is not None
    child.stdin.close()
    _await_exit(child.pid, 60)
    ended = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    assert ended is not None and ended.si_pid == child.pid  # ended, and still there to be reaped
    assert child.wait(timeout=5) == 0


def test_it_gives_up_after_the_timeout_while_the_child_runs(way: str) -> None:
    child = subprocess.Popen(UNTIL_EOF, stdin=subprocess.PIPE)
    assert child.stdin is not None
    try:
        started = time.monotonic()
        _await_exit(child.pid, 0.3)
        assert time.monotonic() - started >= 0.25  # (a margin for clock rounding only)
        assert child.poll() is None
    finally:
        child.stdin.close()
        child.wait(timeout=60)
