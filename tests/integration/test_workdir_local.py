"""--workdir with the local launcher: ranks run in the cache's copy, so edits made after the start never reach
them; and what is refused before anything starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support import clean_env, never_left_running, run_distrun, start_distrun, wait_for_files

# Says it is running (a file in argv[1]), waits for argv[1]/go, then shows what its copy holds.
TRAIN = """\
import os, pathlib, sys, time
marks = pathlib.Path(sys.argv[1])
(marks / f"ready.{os.environ['RANK']}").touch()
while not (marks / "go").exists():
    time.sleep(0.02)
import mod
print(os.getcwd(), mod.VALUE, pathlib.Path("data.txt").read_text().strip())
"""


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "mod.py").write_text("VALUE = 'old'\n")
    (root / "data.txt").write_text("old data\n")
    return root


def test_ranks_run_in_the_copy_and_never_see_later_edits(tmp_path: Path) -> None:
    project = _project(tmp_path / "proj")
    marks = tmp_path / "marks"
    marks.mkdir()
    env = clean_env(DISTRUN_CACHE_DIR=str(tmp_path / "cache"))
    with never_left_running(
        start_distrun("-np", "2", "--workdir", project, "train.py", marks, env=env)
    ) as proc:
        wait_for_files(marks, "ready.*", 2)
        (project / "mod.py").write_text("VALUE = 'new'\n")
        (project / "data.txt").write_text("new data\n")
        (marks / "go").touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    (copy,) = [p for p in (tmp_path / "cache" / "workdir" / "trees").iterdir() if p.is_dir()]
    assert sorted(out.decode().splitlines()) == [f"[{r}] {copy} old old data" for r in range(2)]


def test_too_big_a_workdir_is_refused_naming_the_biggest_files(tmp_path: Path) -> None:
    project = _project(tmp_path / "proj")
    (project / "weights.bin").write_bytes(b"\0" * (2 << 20))
    marks = tmp_path / "marks"
    marks.mkdir()
    env = clean_env(DISTRUN_CACHE_DIR=str(tmp_path / "cache"))
    result = run_distrun("--workdir", project, "--workdir-limit", "1", "train.py", marks, env=env)
    assert result.returncode == 2
    (line,) = result.stderr.decode().splitlines()
    assert line.startswith(
        f"distrun: error: --workdir {project}: 2.0 MiB in 4 files is above the 1.0 MiB limit"
    )
    assert "biggest: weights.bin (2.0 MiB)" in line
    # Nothing of the project was stored (the cache's code/ holds distrun's own compiled methods).
    assert not os.listdir(marks) and not (tmp_path / "cache" / "workdir").exists()


def test_a_script_missing_from_the_workdir_is_exit_127(tmp_path: Path) -> None:
    project = _project(tmp_path / "proj")
    result = run_distrun(
        "--workdir", project, "other.py", env=clean_env(DISTRUN_CACHE_DIR=str(tmp_path / "c"))
    )
    assert result.returncode == 127
    assert result.stderr.decode().splitlines() == [
        f"distrun: error: other.py is not among the files of --workdir {project}"
    ]


def test_a_workdir_that_is_no_directory_is_bad_input(tmp_path: Path) -> None:
    result = run_distrun("--workdir", tmp_path / "nowhere", "train.py")
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"distrun: error: --workdir {tmp_path / 'nowhere'}: not a directory"
    ]


def test_a_restart_runs_in_the_same_copy_and_sends_nothing_again(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(
        "import os, sys\n"
        "print(os.environ['DISTRUN_RESTART_COUNT'], os.getcwd())\n"
        "sys.exit(1 if os.environ['DISTRUN_RESTART_COUNT'] == '0' else 0)\n"
    )
    report = tmp_path / "report.json"
    env = clean_env(DISTRUN_CACHE_DIR=str(tmp_path / "cache"))
    result = run_distrun(
        "--workdir", project, "--max-restarts", "1", "--restart-delay", "0", "--report", report, "train.py",
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    (copy,) = [p for p in (tmp_path / "cache" / "workdir" / "trees").iterdir() if p.is_dir()]
    assert result.stdout.decode().splitlines() == [f"[0] 0 {copy}", f"[0] 1 {copy}"]
    workdir = json.loads(report.read_text())["workdir"]
    assert workdir["hosts"]["localhost"]["files_sent"] == 1, "the restart found the copy there"
