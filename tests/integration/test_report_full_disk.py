"""`--report` on a file system with no room left is refused at the start, like a missing directory, not
found only after the run (issue 27, item 9): a real full tmpfs, so how a write fails there is the kernel's.

A disk that fills during the run (issue 31, item 2): the room held from the start takes the report, and where
the report outgrows it, no earlier run's report is left under the name and the exit code is 4, not 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.report.file import ReportPathError, check_room
from tests.support import clean_env, require_machine, run_distrun

# A tmpfs this small fills with one file; the probe then cannot get its blocks.
SIZE = "256k"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at tmp_path/small, holding an earlier run's report `r.json`; unmounted afterwards."""
    require_machine(None if os.geteuid() == 0 else "mounting a tmpfs needs root", None)
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        (mount / "r.json").write_text('{"outcome": "rank-failed", "command": ["false"]}\n')
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


# The rank: says whether the earlier report is still there, then fills the disk to its last block.
_FILL = """
import os, sys
disk = sys.argv[1]
print("earlier report present:", os.path.exists(os.path.join(disk, "r.json")), flush=True)
try:
    with open(os.path.join(disk, "filler"), "wb") as f:
        while True:
            f.write(bytes(4096))
            f.flush()
except OSError:
    pass
"""


def test_a_disk_filled_during_the_run_still_takes_the_report(small_fs: Path) -> None:
    report = small_fs / "r.json"
    result = run_distrun(
        "--report", report, sys.executable, "-c", _FILL, small_fs, env=clean_env(), timeout=60
    )
    stdout, stderr = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "earlier report present: False" in stdout, "the earlier run's report went when this run started"
    written = json.loads(report.read_text())
    assert (written["outcome"], written["exit_code"]) == ("succeeded", 0)
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler", "r.json"]


def test_a_report_that_outgrows_the_held_room_leaves_no_report_and_exits_4(small_fs: Path) -> None:
    # An argument of 100 kB: the report quotes the command, so it no longer fits the room held for it.
    big = "x" * 100_000
    report = small_fs / "r.json"
    result = run_distrun(
        "--report", report, sys.executable, "-c", _FILL, small_fs, big, env=clean_env(), timeout=60
    )
    stderr = result.stderr.decode()
    assert result.returncode == 4, stderr
    assert stderr.endswith(f"distrun: error: cannot write the report {report}: No space left on device\n")
    assert stderr.count("\n") == 1, stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"], "no stale report, no temporary file"


def test_a_failed_job_whose_report_cannot_be_written_keeps_its_own_exit_code(small_fs: Path) -> None:
    big = "x" * 100_000
    report = small_fs / "r.json"
    result = run_distrun(
        "--report", report, "sh", "-c", f"{sys.executable} -c '{_FILL}' {small_fs}; exit 5", "sh", big,
        env=clean_env(), timeout=60,
    )  # fmt: skip
    stderr = result.stderr.decode()
    assert result.returncode == 5, stderr
    assert f"distrun: cannot write the report {report}: No space left on device\n" in stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs mounted at tmp_path/full, every block taken by a file `filler`; unmounted afterwards."""
    require_machine(None if os.geteuid() == 0 else "mounting a tmpfs needs root", None)
    mount = tmp_path / "full"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)], check=True)
    try:
        # dd stops at ENOSPC with an error: that is the point.
        subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k"], capture_output=True)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_full_file_system_is_refused_before_anything_runs(full_fs: Path, tmp_path: Path) -> None:
    marker = tmp_path / "worker-ran"
    report = full_fs / "r.json"
    result = run_distrun(
        "--report", report, sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close()", marker,
        env=clean_env(), timeout=60,
    )  # fmt: skip
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    said = f"--report {report}: {full_fs} has no room for the report: No space left on device"
    assert stderr == f"distrun: error: {said}\n"
    assert not marker.exists(), "nothing may start when the report cannot be written"
    assert sorted(p.name for p in full_fs.iterdir()) == ["filler"], "the trial file is gone"


def test_room_is_checked_where_a_symlink_leads(full_fs: Path, tmp_path: Path) -> None:
    link = tmp_path / "r.json"
    link.symlink_to(full_fs / "r.json")
    with pytest.raises(ReportPathError, match="has no room for the report"):
        check_room(link)


def test_room_once_freed_is_accepted(full_fs: Path) -> None:
    (full_fs / "filler").unlink()
    check_room(full_fs / "r.json")
    assert list(full_fs.iterdir()) == []
