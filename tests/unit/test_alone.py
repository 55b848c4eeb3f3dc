"""tests/alone.py with real processes: while one holds the machine alone, no other takes it, shared or not;
shared holders run side by side."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import REPO

HOLD = """
import sys, time
from pathlib import Path
from tests import alone
with alone.running(sys.argv[1] == "alone"):
    Path(sys.argv[2]).write_text(str(time.monotonic()))
    while not Path(sys.argv[3]).exists():
        time.sleep(0.02)
"""


def _run(tmp_path: Path) -> str:
    return f"alone-test-{tmp_path.name}"


def _hold(kind: str, began: Path, release: Path) -> subprocess.Popen[bytes]:
    env = {"PYTEST_XDIST_TESTRUNUID": _run(began.parent), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", HOLD, kind, str(began), str(release)], env=env)


def _wait(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never began"
        time.sleep(0.02)


def _wait_for_the_gate(tmp_path: Path, timeout: float = 30.0) -> None:
    """Until someone holds the gate (only a test that runs alone keeps it)."""
    gate = Path(tempfile.gettempdir()) / f"distrun-tests-{_run(tmp_path)}.gate"
    deadline = time.monotonic() + timeout
    while True:
        with open(gate, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(handle, fcntl.LOCK_UN)
        assert time.monotonic() < deadline, "the test to run alone never took the gate"
        time.sleep(0.02)


def test_an_alone_test_waits_for_the_running_ones_and_holds_off_new_ones(tmp_path: Path) -> None:
    shared = _hold("shared", tmp_path / "shared.began", tmp_path / "shared.release")
    _wait(tmp_path / "shared.began")
    other = _hold("shared", tmp_path / "other.began", tmp_path / "other.release")
    _wait(tmp_path / "other.began")  # two shared holders side by side
    single = _hold("alone", tmp_path / "alone.began", tmp_path / "alone.release")
    _wait_for_the_gate(tmp_path)
    time.sleep(0.5)  # time to get in wrongly: an event that must not happen has nothing to await
    assert not (tmp_path / "alone.began").exists(), "it began beside running tests"
    late = _hold("shared", tmp_path / "late.began", tmp_path / "late.release")
    (tmp_path / "shared.release").touch()
    (tmp_path / "other.release").touch()
    _wait(tmp_path / "alone.began")
    time.sleep(0.5)
    assert not (tmp_path / "late.began").exists(), "a test began beside the one running alone"
    (tmp_path / "alone.release").touch()
    _wait(tmp_path / "late.began")
    (tmp_path / "late.release").touch()
    for proc in (shared, other, single, late):
        assert proc.wait(timeout=30) == 0
