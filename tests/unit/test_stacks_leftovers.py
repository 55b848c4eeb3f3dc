"""Issue 27, in-process, with real processes as owners: what a SIGKILL leaves is stale and goes (item 8), the
runtime directory is one this user may use (item 13), a stopped process is named by its state (item 12)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.agent.stackdump import DIR_PREFIX, LOCK_NAME, DumpDir, remove_leftovers, unreadable_state
from launcher.diagnose.control import ControlServer, chosen_dir, is_stale, remove_stale, runtime_dir
from tests.support import never_left_running, wait_until

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


def test_only_this_users_dump_directories_with_a_free_lock_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f"{DIR_PREFIX}1-stale"
    stale.mkdir()
    (stale / LOCK_NAME).write_text("")
    being_made = tmp_path / f"{DIR_PREFIX}2-new"  # no lock yet: its agent is making it
    being_made.mkdir()
    others = tmp_path / f"{DIR_PREFIX}3-other"
    others.mkdir()
    (others / LOCK_NAME).write_text("")
    os.chown(others, 65534, 65534)
    unrelated = tmp_path / "not-distrun"
    unrelated.mkdir()
    (unrelated / LOCK_NAME).write_text("")
    assert remove_leftovers(str(tmp_path)) == [str(stale)]
    assert being_made.exists() and others.exists() and unrelated.exists()


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


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("owner", "mode", "use_xdg"),
    [
        (None, 0o700, True),  # ours
        (65534, 0o700, False),  # another user's, as `su`/`sudo -u` keep it
        (None, 0o500, os.getuid() == 0),  # not writable (root may write anyway)
    ],
)
def test_the_runtime_directory_is_xdgs_only_where_that_is_this_users(
    xdg: Path, owner: int | None, mode: int, use_xdg: bool
) -> None:
    if owner is not None:
        os.chown(xdg, owner, owner)
    xdg.chmod(mode)
    try:
        expected = xdg / "distrun" if use_xdg else Path(f"/tmp/distrun-{os.getuid()}")
        assert chosen_dir() == expected
        if use_xdg:
            assert runtime_dir() == expected
    finally:
        xdg.chmod(0o700)
        os.chown(xdg, os.getuid(), os.getgid())


def test_no_xdg_runtime_dir_is_the_per_uid_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert chosen_dir() == Path(f"/tmp/distrun-{os.getuid()}")


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
