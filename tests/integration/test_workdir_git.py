"""Which files --workdir sends, as the real git answers: outside a work tree, inside one (.gitignore), a git
that refuses to answer, and a directory an outer repository ignores."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.workdir.files import WorkdirError, candidate_paths
from tests.support import write_tree


def test_outside_git_default_excludes_and_own_ignore_file(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "train.py": "",
            "pkg/mod.py": "",
            "pkg/__pycache__/mod.cpython-311.pyc": "",
            ".venv/bin/python": "",
            "venv/lib/x.py": "",
            "old.pyc": "",
            "ckpt/model.pt": "",
            ".distrunignore": "ckpt/\n",
        },
    )
    paths = candidate_paths(tmp_path)
    assert paths == [".distrunignore", "pkg/mod.py", "train.py"]


def test_in_git_gitignore_is_honoured_and_git_not_sent(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "train.py": "",
            "secret.env": "",
            ".gitignore": "secret.env\n",
            "untracked.py": "",
            "big.bin": "",
            ".distrunignore": "*.bin\n",
        },
    )
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "train.py", ".gitignore"], check=True)
    paths = candidate_paths(tmp_path)
    assert paths == [".distrunignore", ".gitignore", "train.py", "untracked.py"]


def test_a_git_that_refuses_to_answer_is_an_error_not_everything_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the repository another owner")
    write_tree(tmp_path, {"train.py": "", "secret.env": "", ".gitignore": "secret.env\n"})
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    os.chown(tmp_path, 12345, 12345)  # git refuses a repository of another owner ("dubious ownership")
    monkeypatch.setenv("HOME", str(tmp_path))  # no safe.directory from the real ~/.gitconfig
    for name in [n for n in os.environ if n.startswith("GIT_")]:
        monkeypatch.delenv(name)
    with pytest.raises(WorkdirError, match=r"git ls-files failed: .*dubious ownership"):
        candidate_paths(tmp_path)


def test_a_directory_that_an_outer_repository_ignores_is_walked(tmp_path: Path) -> None:
    write_tree(
        tmp_path, {".gitignore": "build/\n", "build/proj/train.py": "", "build/proj/__pycache__/x.pyc": ""}
    )
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert candidate_paths(tmp_path / "build" / "proj") == ["train.py"]
