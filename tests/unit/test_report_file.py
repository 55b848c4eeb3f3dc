"""`--report` writes through symlinks and over regular files as `>` would, refuses everything else, and never
leaves a half report or a temporary file behind (issue 19, defect 1)."""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.report.file import ReportPathError, report_target, write_whole

# Each case builds what is at `tmp/r.json` and returns the file that must get the report.
Setup = Callable[[Path], Path]


def _new(tmp: Path) -> Path:
    return tmp / "r.json"


def _regular(tmp: Path) -> Path:
    (tmp / "r.json").write_text("old")
    return tmp / "r.json"


def _link_to_regular(tmp: Path) -> Path:
    (tmp / "real.json").write_text("old")
    (tmp / "r.json").symlink_to("real.json")
    return tmp / "real.json"


def _dangling_link(tmp: Path) -> Path:
    (tmp / "sub").mkdir()
    (tmp / "r.json").symlink_to(tmp / "sub" / "later.json")
    return tmp / "sub" / "later.json"


def _chain_of_links(tmp: Path) -> Path:
    (tmp / "sub").mkdir()
    (tmp / "sub" / "real.json").write_text("old")
    (tmp / "hop").symlink_to("sub/real.json")
    (tmp / "r.json").symlink_to("hop")
    return tmp / "sub" / "real.json"


@pytest.mark.parametrize(
    "setup", [_new, _regular, _link_to_regular, _dangling_link, _chain_of_links], ids=lambda f: f.__name__
)
def test_writes_the_regular_file_the_path_leads_to(tmp_path: Path, setup: Setup) -> None:
    target = setup(tmp_path)
    was_link = (tmp_path / "r.json").is_symlink()
    write_whole(tmp_path / "r.json", "new\n")
    assert target.read_text() == "new\n"
    assert (tmp_path / "r.json").is_symlink() == was_link, "a symlink stays a symlink"
    assert not [p for p in tmp_path.rglob(".*.tmp")], "no temporary file left"


def test_keeps_the_permission_bits_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    path.chmod(0o640)
    write_whole(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "r.json")
    return tmp / "r.json"


def _directory(tmp: Path) -> Path:
    (tmp / "r.json").mkdir()
    return tmp / "r.json"


def _device(tmp: Path) -> Path:
    (tmp / "r.json").symlink_to("/dev/null")
    return Path("/dev/null")


def _socket(tmp: Path) -> Path:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp / "r.json"))
    sock.close()
    return tmp / "r.json"


def _link_to_fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe")
    (tmp / "r.json").symlink_to("pipe")
    return tmp / "pipe"


@pytest.mark.parametrize(
    ("setup", "kind"),
    [
        (_fifo, "a FIFO"),
        (_directory, "a directory"),
        (_device, "a character device"),
        (_socket, "a socket"),
        (_link_to_fifo, "a FIFO"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_refuses_what_is_not_a_regular_file_and_leaves_it_alone(
    tmp_path: Path, setup: Setup, kind: str
) -> None:
    thing = setup(tmp_path)
    before = os.stat(thing)
    with pytest.raises(ReportPathError, match=f"is {kind}, not a regular file") as caught:
        report_target(tmp_path / "r.json")
    assert "\n" not in str(caught.value) and str(tmp_path / "r.json") in str(caught.value)
    with pytest.raises(ReportPathError):
        write_whole(tmp_path / "r.json", "new")
    after = os.stat(thing)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), "it is still what it was"


def test_a_failed_write_leaves_the_old_report_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        write_whole(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_missing_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ReportPathError, match=r"directory .*/no does not exist"):
        report_target(tmp_path / "no" / "r.json")
