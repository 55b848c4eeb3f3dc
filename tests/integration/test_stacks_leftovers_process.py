"""Issue 27 with real processes as owners: what a SIGKILL leaves is stale and goes (item 8), a stopped process
is named by its state (item 12), a control socket whose job ended is removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.agent.stackdump import DIR_PREFIX, LOCK_NAME, DumpDir, unreadable_state
from launcher.runtime.control import ControlServer, is_stale, remove_stale, runtime_dir
from tests.support import never_left_running, wait_until


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path


HOLD_DUMP_DIR = (
    "import time; from launcher.agent.stackdump import DumpDir; "
    "print(DumpDir().path, flush=True); time.sleep(60)"
)


def _holder() -> tuple[subprocess.Popen[bytes], Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD_DUMP_DIR], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().decode().strip())


def test_a_dump_directory_whose_agent_was_killed_goes_and_a_live_ones_stays(tmp_path: Path) -> None:
    killed, killed_dir = _holder()
    live, live_dir = _holder()
    with never_left_running(live), never_left_running(killed):
        assert killed_dir.name.startswith(f"{DIR_PREFIX}{killed.pid}-")
        killed.kill()
        killed.wait()
        assert killed_dir.exists(), "nobody removes it when its agent is killed"
        dump_dir = DumpDir()  # the next agent's start
        try:
            assert not killed_dir.exists()
            assert live_dir.exists() and (live_dir / LOCK_NAME).exists()
        finally:
            dump_dir.remove()


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (signal.SIGSTOP, "it is stopped (SIGSTOP or SIGTSTP; kill -CONT {pid} resumes it)"),
        (None, ""),
    ],
)
def test_a_stopped_process_is_named_by_its_state(stop: int | None, expected: str) -> None:
    with never_left_running(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])) as proc:
        if stop is not None:
            os.kill(proc.pid, stop)
            wait_until(lambda: unreadable_state(proc.pid) != "", 10)
        assert unreadable_state(proc.pid) == expected.replace("{pid}", str(proc.pid))
        proc.kill()
        proc.wait()
    assert unreadable_state(proc.pid) == "it has exited"


def test_stale_sockets_go_at_a_jobs_start_and_live_ones_stay(xdg: Path) -> None:
    directory = runtime_dir()
    gone = directory / "999999999.sock"  # no such process
    gone.touch()
    reused = directory / f"{os.getppid()}.sock"  # made before its pid's process started: another life's
    reused.touch()
    long_ago = time.time() - 10 * 365 * 86400
    os.utime(reused, (long_ago, long_ago))
    with never_left_running(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])) as proc:
        mine = directory / f"{proc.pid}.sock"
        mine.touch()
        assert [is_stale(p) for p in (gone, reused, mine)] == [True, True, False]
        server = ControlServer()
        try:
            assert not gone.exists() and not reused.exists() and mine.exists()
        finally:
            server.close()
    remove_stale(directory)
    assert not mine.exists(), "its job ended"
