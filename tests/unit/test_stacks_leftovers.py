"""Issue 27, in-process: what a SIGKILL leaves is stale and goes (item 8), the runtime directory is one this
user may use (item 13). With real processes as owners: tests/integration/test_stacks_leftovers_process.py."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from launcher.agent import stackdump
from launcher.agent.stackdump import DIR_PREFIX, LOCK_NAME, remove_leftovers
from launcher.runtime.control import chosen_dir, runtime_dir


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


def test_an_agent_making_its_directory_is_never_taken_for_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another agent's clean-up runs while this one makes its directory, at the worst moment: after its lock
    file was opened, before it is locked. The directory is not a leftover then."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real_flock = stackdump.fcntl.flock
    removed: list[list[str]] = []

    def flock_after_another_agents_cleanup(fd: int, operation: int) -> None:
        if operation == stackdump.fcntl.LOCK_EX:  # this agent taking its own lock, blocking
            removed.append(remove_leftovers(str(tmp_path)))
        real_flock(fd, operation)

    monkeypatch.setattr(stackdump.fcntl, "flock", flock_after_another_agents_cleanup)
    made = stackdump.DumpDir()
    try:
        assert removed == [[]]
        assert (Path(made.path) / LOCK_NAME).exists()
        assert Path(made.stack_file(1)).parent.is_dir()
    finally:
        made.remove()
