"""`--report` on a file system with no room left is refused at the start, like a missing directory, not
found only after the run (issue 27, item 9): a real full tmpfs, so how a write fails there is the kernel's."""

from __future__ import annotations

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
