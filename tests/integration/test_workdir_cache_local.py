"""--workdir's cache with real launches on this machine: what a rank does to its copy never reaches the next
job, a full disk leaves nothing behind that fails later syncs, and the cache holds each content once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import clean_env, run_distrun

# Prints what v.txt holds, then (with an argument) rewrites it in place as a careless rank would: as root the
# missing write bit does not stop it; as anyone else, a chmod first.
EDITOR = """\
import os, pathlib, sys
v = pathlib.Path("v.txt")
print("read", v.read_text().strip())
if len(sys.argv) > 1:
    os.chmod(v, 0o644)
    with open(v, "r+") as f:
        f.write("EDITED")
    print("wrote", v.read_text().strip())
"""


def _launch(
    project: Path, cache: Path, *args: str, report: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    extra = ("--report", str(report)) if report is not None else ()
    env = clean_env(DISTRUN_CACHE_DIR=str(cache))
    return run_distrun("--workdir", project, *extra, "-v", "edit.py", *args, env=env, timeout=120)


def test_a_rank_that_edits_its_copy_changes_nothing_for_the_next_job(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "edit.py").write_text(EDITOR)
    (project / "v.txt").write_text("original\n")
    cache, report = tmp_path / "cache", tmp_path / "report.json"

    editing = _launch(project, cache, "edit")
    assert editing.returncode == 0, editing.stderr.decode()
    assert editing.stdout.decode().splitlines() == ["[0] read original", "[0] wrote EDITEDal"]

    again = _launch(project, cache, report=report)
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout.decode().splitlines() == ["[0] read original"]
    # The edit went through the hard link into the object: found, dropped and sent again.
    assert json.loads(report.read_text())["workdir"]["hosts"]["localhost"]["files_sent"] == 1
    objects = list((cache / "workdir" / "objects").glob("*/*"))
    assert {p.parent.name + p.name for p in objects} == {
        hashlib.sha256(p.read_bytes()).hexdigest() for p in (project / "edit.py", project / "v.txt")
    }
    for obj in objects:
        assert hashlib.sha256(obj.read_bytes()).hexdigest() == obj.parent.name + obj.name


def test_the_cache_holds_each_file_once(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "edit.py").write_text(EDITOR)
    (project / "v.txt").write_text("original\n")
    (project / "weights.bin").write_bytes(os.urandom(4 << 20))
    (project / "sparse.bin").write_bytes(b"")
    os.truncate(project / "sparse.bin", 64 << 20)  # 64 MiB of hole
    cache = tmp_path / "cache"
    result = _launch(project, cache)
    assert result.returncode == 0, result.stderr.decode()
    used = subprocess.run(["du", "-s", "-B1", str(cache)], capture_output=True, check=True, text=True)
    assert int(used.stdout.split()[0]) < 5 << 20, "4 MiB of data once, the hole not written"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_sync_cut_by_a_full_disk_leaves_nothing_that_fails_later_ones(
    tmp_path: Path, small_disk: Path
) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "edit.py").write_text(EDITOR)
    (big / "v.txt").write_text("big\n")
    for i in range(4):
        (big / f"part{i}.bin").write_bytes(os.urandom(1 << 20))
    cut = _launch(big, small_disk)
    assert cut.returncode == 3, cut.stderr.decode()
    assert "No space left on device" in cut.stderr.decode()
    assert os.listdir(small_disk / "workdir" / "tmp") == [], "the unfinished object was removed"

    small = tmp_path / "small"
    small.mkdir()
    (small / "edit.py").write_text(EDITOR)
    (small / "v.txt").write_text("small\n")
    # More than the cut sync left free, less than the disk: what that sync stored is given up for it.
    (small / "data.bin").write_bytes(os.urandom(3 << 19))
    for attempt in range(2):  # the first that fits, and the one after it
        fits = _launch(small, small_disk)
        assert fits.returncode == 0, f"attempt {attempt}: {fits.stderr.decode()}"
        assert fits.stdout.decode().splitlines() == ["[0] read small"]
    assert os.listdir(small_disk / "workdir" / "tmp") == []
