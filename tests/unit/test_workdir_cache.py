"""The workdir cache's promises, in-process: a copy is what its name says whenever a job starts in it, an
object never changes unnoticed, each content is stored once (hard links, holes kept), modes travel, and
nothing a failed or killed transfer wrote stays in tmp/."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.agent import store as store_module
from launcher.agent.store import STAMP, Store, manifest_hash
from launcher.errors import HostError
from launcher.workdir import files as wdfiles
from launcher.workdir.files import WorkdirChanged, WorkdirError, scan
from launcher.workdir.sync import Blobs

MIB = 1 << 20


def _entry(path: str, data: bytes, mode: int = 0o644) -> list[Any]:
    return [path, "f", hashlib.sha256(data).hexdigest(), len(data), mode]


def _stored(store: Store, files: dict[str, tuple[bytes, int]]) -> tuple[list[list[Any]], str]:
    entries = [_entry(path, data, mode) for path, (data, mode) in files.items()]
    entries.append(["link.py", "l", "a.py", 0, False])
    for data, _mode in files.values():
        store.put(hashlib.sha256(data).hexdigest(), data)
    mhash = manifest_hash(entries)
    store.materialize(entries, mhash, "proj")
    return entries, mhash


FILES = {"a.py": (b"A = 1\n", 0o644), "sub/v.txt": (b"original\n", 0o644), "run.sh": (b"#!/bin/sh\n", 0o755)}


def _write_through(path: Path) -> None:
    """A rank that writes to its file in place anyway (root ignores the missing write bit; others chmod)."""
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.write(b"EDITED")


def _replace(path: Path) -> None:
    """An editor's save: a new file renamed over the old one."""
    (path.parent / "new").write_bytes(b"edited\n")
    os.replace(path.parent / "new", path)


def _into_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")


def _directory_elsewhere(directory: Path) -> None:
    """The directory moved out and a symlink to it left in its place: repairs must not write through it."""
    elsewhere = directory.parent.parent / "elsewhere"
    shutil.move(directory, elsewhere)
    directory.symlink_to(elsewhere)
    (elsewhere / "v.txt").chmod(0o644)
    (elsewhere / "v.txt").write_text("elsewhere\n")


CHANGES: dict[str, Callable[[Path], None]] = {
    "written in place": _write_through,
    "replaced by a rename": _replace,
    "removed": Path.unlink,
    "made writable": lambda path: path.chmod(0o666),
    "truncated": lambda path: os.truncate(path, 0),
    "touched": lambda path: os.utime(path, (1, 1)),
    "turned into a directory": _into_directory,
    "its directory removed": lambda path: shutil.rmtree(path.parent),
    "its directory a symlink elsewhere": lambda path: _directory_elsewhere(path.parent),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_copy_changed_in_any_way_is_put_right_before_the_next_job(tmp_path: Path, change: str) -> None:
    store = Store(str(tmp_path))
    entries, mhash = _stored(store, FILES)
    copy = Path(store.tree_path(mhash))
    v_digest = hashlib.sha256(b"original\n").hexdigest()
    CHANGES[change](copy / "sub" / "v.txt")

    wanted = store.missing(entries, mhash)
    if change in (
        "written in place",
        "truncated",
        "its directory a symlink elsewhere",
    ):  # through the hard link: the object changed, sent again
        assert wanted == [v_digest]
        assert not os.path.exists(store.object_path(v_digest))
        store.put(v_digest, b"original\n")
    else:
        assert wanted == []
    assert store.materialize(entries, mhash, "proj") == (str(copy), False)
    assert (copy / "sub" / "v.txt").read_bytes() == b"original\n"
    assert store.check(entries, mhash) == []
    assert stat.S_IMODE((copy / "sub" / "v.txt").stat().st_mode) == 0o444
    assert hashlib.sha256(Path(store.object_path(v_digest)).read_bytes()).hexdigest() == v_digest
    assert not (copy / "sub").is_symlink()


def test_a_changed_symlink_and_an_untouched_copy(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    entries, mhash = _stored(store, FILES)
    copy = Path(store.tree_path(mhash))
    assert store.check(entries, mhash) == [], "untouched: nothing to put right"
    (copy / "link.py").unlink()
    (copy / "link.py").symlink_to("run.sh")
    assert [e[0] for e in store.check(entries, mhash)] == ["link.py"]
    assert store.repair(entries, mhash) == ["link.py"]
    assert os.readlink(copy / "link.py") == "a.py"


def test_an_object_written_through_any_copy_is_never_used_unnoticed(tmp_path: Path) -> None:
    """Two copies share an object; a rank of one writes through its link: the other copy's check finds it."""
    store = Store(str(tmp_path))
    first, first_hash = _stored(store, FILES)
    second, second_hash = _stored(store, {**FILES, "b.py": (b"B = 2\n", 0o644)})
    _write_through(Path(store.tree_path(first_hash)) / "a.py")
    a_digest = hashlib.sha256(b"A = 1\n").hexdigest()
    assert store.missing(second, second_hash) == [a_digest]
    assert store.missing(first, first_hash) == [a_digest]


def test_copies_link_the_objects_keep_modes_and_holes(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    sparse = b"\0" * (8 * MIB) + b"end"
    files = {
        **FILES,
        "private.key": (b"secret-ish\n", 0o600),
        "frozen.txt": (b"frozen\n", 0o444),
        "weights.bin": (sparse, 0o644),
    }
    entries, mhash = _stored(store, files)
    _, other_hash = _stored(store, {**files, "c.py": (b"C\n", 0o644)})
    copy, copy2 = Path(store.tree_path(mhash)), Path(store.tree_path(other_hash))
    modes = {
        p: stat.S_IMODE((copy / p).stat().st_mode) for p in ("a.py", "run.sh", "private.key", "frozen.txt")
    }
    assert modes == {"a.py": 0o444, "run.sh": 0o555, "private.key": 0o400, "frozen.txt": 0o444}
    for path, (data, _mode) in files.items():
        mine, theirs = (copy / path).stat(), (copy2 / path).stat()
        assert (mine.st_ino, mine.st_mtime) == (theirs.st_ino, STAMP), f"{path}: one inode for both copies"
        assert (copy / path).read_bytes() == data
    assert (copy / "a.py").stat().st_ino == os.stat(store.object_path(entries[0][2])).st_ino
    assert (copy / "weights.bin").stat().st_blocks * 512 < MIB, "the 8 MiB of zeros stayed a hole"


def test_without_hard_links_the_copy_gets_sparse_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(source: str, dest: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(store_module.os, "link", no_links)
    store = Store(str(tmp_path))
    entries, mhash = _stored(store, {**FILES, "weights.bin": (b"\0" * (4 * MIB) + b"x", 0o644)})
    copy = Path(store.tree_path(mhash))
    assert (copy / "weights.bin").stat().st_nlink == 1 and (copy / "weights.bin").stat().st_blocks * 512 < MIB
    assert (copy / "sub/v.txt").read_bytes() == b"original\n"
    assert store.check(entries, mhash) == []
    _write_through(copy / "sub" / "v.txt")
    assert store.missing(entries, mhash) == [], "its own inode: the object is intact, nothing to send"
    assert store.repair(entries, mhash) == ["sub/v.txt"]
    assert (copy / "sub/v.txt").read_bytes() == b"original\n"


def test_a_failed_write_leaves_nothing_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path))
    real_write = os.write

    def full_after_a_block(fd: int, data: Any) -> int:
        if os.lseek(fd, 0, os.SEEK_CUR) >= store_module.BLOCK:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(store_module.os, "write", full_after_a_block)
    data = os.urandom(4 * store_module.BLOCK)
    with pytest.raises(OSError, match="No space left"):
        store.put(hashlib.sha256(data).hexdigest(), data)
    assert os.listdir(store.tmp) == []
    assert not os.path.exists(store.object_path(hashlib.sha256(data).hexdigest()))


def test_reclaim_removes_what_processes_that_are_gone_left(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = os.uname().nodename
    leftovers = {
        f"abc.{gone.pid}.0000.{host}": True,  # a killed transfer of this host: reclaimed
        f"abc.{os.getpid()}.0000.{host}": False,  # in progress here
        f"abc.{gone.pid}.0000.another-host": False,  # a cache shared with another host: its own business
    }
    for name in leftovers:
        (Path(store.tmp) / name).write_bytes(b"x" * 100)
    os.mkdir(Path(store.tmp) / f"copy.{gone.pid}.0000.{host}")
    assert store.reclaim() == 2
    assert sorted(os.listdir(store.tmp)) == sorted(name for name, gone in leftovers.items() if not gone)


def test_the_limit_is_decided_by_sizes_before_any_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "big.bin").write_bytes(b"x" * 5000)
    (tmp_path / "a.py").write_text("A = 1\n")

    def no_reading(path: Path) -> str:
        raise AssertionError(f"{path} was read")

    monkeypatch.setattr(wdfiles, "_hash_file", no_reading)
    with pytest.raises(WorkdirError, match="above the"):
        scan(tmp_path, limit=4000)


def test_every_permission_bit_travels(tmp_path: Path) -> None:
    for name, mode in (("private", 0o600), ("frozen", 0o444), ("tool", 0o750), ("plain", 0o644)):
        (tmp_path / name).write_text(name)
        (tmp_path / name).chmod(mode)
    found = {f.path: f.mode for f in scan(tmp_path).files}
    assert found == {"private": 0o600, "frozen": 0o444, "tool": 0o750, "plain": 0o644}
    assert {e[0]: e[4] for e in scan(tmp_path).entries}["tool"] == 0o750


@pytest.mark.parametrize("how", ["edited", "removed"])
def test_a_file_that_changes_while_it_is_sent_is_bad_input_naming_it(tmp_path: Path, how: str) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    workdir = scan(tmp_path)
    if how == "edited":
        (tmp_path / "train.py").write_text("print(2)\n")
    else:
        (tmp_path / "train.py").unlink()
    with pytest.raises(WorkdirChanged) as err:
        Blobs(workdir).body(workdir.files[0].digest)
    assert err.value.exit_code == 2
    assert str(err.value).startswith("--workdir: train.py ")
    # The sync's wait passes a sender's HostError on as it is: so it ends the launch with its own code.
    assert isinstance(err.value, HostError) and err.value.host is None


def test_room_is_made_only_of_what_no_copy_and_no_sync_needs_and_only_when_no_one_else_adds(
    tmp_path: Path,
) -> None:
    store = Store(str(tmp_path))
    entries, mhash = _stored(store, FILES)
    orphan, wanted = b"of a sync the disk cut", b"of this sync"
    for data in (orphan, wanted):
        store.put(hashlib.sha256(data).hexdigest(), data)
    (Path(store.tmp) / "left-behind").write_bytes(b"x")
    other = Store(str(tmp_path))
    with store.adding():
        store.missing([*entries, _entry("w.bin", wanted)], "another-copy")
        with other.adding():
            assert not store.make_room(), "another job adds: nothing is removed"
        assert os.path.exists(store.object_path(hashlib.sha256(orphan).hexdigest()))
        assert store.make_room()
        with pytest.raises(BlockingIOError):  # still held shared: a pruner cannot start meanwhile
            fd = os.open(os.path.join(store.root, "lock"), os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    assert not os.path.exists(store.object_path(hashlib.sha256(orphan).hexdigest()))
    assert os.path.exists(store.object_path(hashlib.sha256(wanted).hexdigest()))
    assert os.listdir(store.tmp) == [] and store.check(entries, mhash) == []
