"""Which files --workdir sends, as the real git answers: outside a work tree, inside one (.gitignore), a git
that refuses to answer, and a directory an outer repository ignores."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.workdir.files import GIT_RULES, LeftOut, WorkdirError, candidate_paths, left_out_by, scan
from tests.multihost.support import Where
from tests.support import run_distrun, write_tree


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


def _project_with_ignored_data(root: Path) -> Path:
    """A git project whose .gitignore leaves out data/ (two files, 1.5 KiB), a virtual environment and a
    checkpoint that .distrunignore leaves out anyway; train.py reads data/train.csv."""
    write_tree(
        root,
        {
            "train.py": "print(open('data/train.csv').read())\n",
            ".gitignore": "data/\n.venv/\n*.pt\n",
            "data/train.csv": "x" * 1024,
            "data/val.csv": "y" * 512,
            ".venv/bin/python": "",
            "model.pt": "weights",
            ".distrunignore": "*.pt\n",
        },
    )
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "train.py", ".gitignore", ".distrunignore"], check=True)
    return root


def test_what_gitignore_leaves_out_is_counted_without_what_is_never_sent(tmp_path: Path) -> None:
    """data/ counts (2 files, 1536 bytes); .venv/ (never sent) and model.pt (.distrunignore) do not."""
    workdir = scan(_project_with_ignored_data(tmp_path))
    assert workdir.left_out == LeftOut(2, 1536, (("data/", 2, 1536),))
    assert left_out_by(workdir, "data/train.csv") == GIT_RULES
    assert left_out_by(workdir, str(tmp_path / "data" / "val.csv")) == GIT_RULES
    assert left_out_by(workdir, "model.pt") == ".distrunignore"
    assert left_out_by(workdir, "train.py") is None  # in the copy
    assert left_out_by(workdir, "data/absent.csv") is None  # nowhere: nothing was left out
    subprocess.run(["git", "-C", str(tmp_path), "add", "-f", "data/train.csv"], check=True)
    tracked = scan(tmp_path)
    assert "data/train.csv" in {f.path for f in tracked.files}
    assert tracked.left_out == LeftOut(1, 512, (("data/val.csv", 1, 512),))


def test_a_rank_missing_a_file_that_gitignore_left_out_is_told_why(tmp_path: Path, where: Where) -> None:
    """At launch distrun says what .gitignore leaves out and how to send it; the rank's FileNotFoundError
    for data/train.csv is then named in the summary as a file of the workdir that the copy lacks."""
    project = _project_with_ignored_data(tmp_path / "proj")
    hosts = where.either(("-np", "1"), ("-H", "h1:1"))
    env = where.env(DISTRUN_CACHE_DIR=str(tmp_path / "cache"))
    done = run_distrun(*hosts, "--workdir", project, "train.py", env=env)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert (
        f"distrun: --workdir {project}: git's ignore rules (.gitignore) leave out 2 files (1.5 KiB) that the "
        "ranks will not find in the copy: data/ (2 files, 1.5 KiB); to send them, have git track them "
        "(git add -f data/: tracked files travel), or read them from a path every host has\n"
    ) in err, err
    assert "FileNotFoundError" in err, err
    assert (
        f"rank 0 did not find data/train.csv: --workdir {project} has it, but git's ignore rules left it out "
        "of the copy the ranks run in; to send it, have git track it (git add -f data/train.csv"
    ) in err, err
    where.assert_clean()
