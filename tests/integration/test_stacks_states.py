"""`distrun stacks` with real jobs in the states issue 27 found (items 8, 10, 12, 13, 14, 15): leftovers of a
SIGKILL, deep recursion, a stopped rank, an unwritable runtime directory, a rank inside pytest, a reused
--output-dir. In-process tables: tests/unit/test_stack_readable.py, tests/unit/test_stacks_leftovers.py.
The tests taking `where` run on SSH hosts of the simulated cluster too (tests/multihost).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from launcher.agent.stackdump import LOCK_NAME
from tests.multihost.support import Where
from tests.support import (
    SCRIPTS,
    ask_stacks_until,
    clean_env,
    distrun_argv,
    never_left_running,
    run_distrun,
    sleeping_rank,
    start_distrun,
    wait_for_files,
    wait_until,
)

LOCAL = Where(None)


def _own_runtime(tmp_path: Path, where: Where = LOCAL) -> dict[str, str]:
    """An XDG_RUNTIME_DIR of the test's own: its jobs' sockets are the only ones there."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    return where.env(pythonpath=False, XDG_RUNTIME_DIR=str(runtime))


def test_a_deep_recursion_from_two_callers_is_two_groups(tmp_path: Path, where: Where) -> None:
    """faulthandler shows only the innermost 100 frames, alike for both ranks: the whole stacks separate them,
    and the console keeps both ends of each with a mark between. On SSH hosts: one rank on each."""
    env = _own_runtime(tmp_path, where)
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))
    job = start_distrun(
        *hosts, "--stack-tool", "python", SCRIPTS / "stack_cases.py", tmp_path, "deep", env=env
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        shown = ask_stacks_until(job.pid, "different places", env)
    if where.ssh:
        assert "rank 0 (1 of 2) on h1:" in shown and "rank 1 (1 of 2) on h2:" in shown, shown
        assert shown.count(", in from_left") == 1 and shown.count(", in from_right") == 1, shown
        assert "frames not shown (in walk)" in shown and "stacks cut" not in shown, shown
        where.assert_clean(within=10)
        return
    lines = shown.splitlines()
    assert "rank 0 (1 of 2) on localhost:" in lines and "rank 1 (1 of 2) on localhost:" in lines, shown
    assert shown.count(", in from_left") == 1 and shown.count(", in from_right") == 1, shown
    assert any(line.strip().startswith("... ") and "frames not shown (in walk)" in line for line in lines)
    assert "same place" not in shown and "stacks cut" not in shown, shown
    assert lines[-1].startswith("verdict: the ranks are in 2 different places"), shown


def test_a_deep_stack_blocked_outside_python_is_marked_as_cut(tmp_path: Path) -> None:
    """No Python code runs to read the whole stacks: faulthandler's innermost 100 frames are all there is,
    and the output says so instead of calling the ranks' place the same without a word."""
    env = _own_runtime(tmp_path)
    job = start_distrun(
        "-np", "2", "--stack-tool", "python", "--grace-period", "1", SCRIPTS / "stack_cases.py", tmp_path,
        "deep-in-c", env=env,
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        shown = ask_stacks_until(job.pid, "stacks cut at 100 frames", env)
    assert "ranks 0-1 (2 of 2) on localhost:" in shown, shown
    assert "    ... outer frames not read (faulthandler stops at 100)" in shown, shown
    assert shown.splitlines()[-1].endswith(
        "; ranks 0-1: stacks cut at 100 frames, they may differ further out"
    )


def test_a_stopped_rank_is_named_at_once(tmp_path: Path, where: Where) -> None:
    env = _own_runtime(tmp_path, where)
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))
    job = start_distrun(
        *hosts, "--stack-tool", "python", "--grace-period", "1", SCRIPTS / "stack_cases.py", tmp_path,
        "stopped", env=env,
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        pid = int((tmp_path / "1.pid").read_text())
        if not where.ssh:
            wait_until(lambda: _state(pid) == "T", 30)
        shown = ask_stacks_until(job.pid, "cannot read the stacks: it is stopped", env)
    if where.ssh:
        assert "rank 1 (1 of 2) on h2: cannot read the stacks: it is stopped (SIGSTOP or SIGTSTP" in shown, (
            shown
        )
        # Named, not waited out: the agent's own wait for a rank (15 s) would say "no stacks within". Not
        # timed: `distrun stacks` alone took over 10 s to start on a loaded machine.
        assert "no stacks within" not in shown, shown
        where.assert_clean(within=10)
        return
    stopped = f"it is stopped (SIGSTOP or SIGTSTP; kill -CONT {pid} resumes it)"
    assert f"rank 1 (1 of 2) on localhost: cannot read the stacks: {stopped}" in shown
    # The agent's own wait for a rank is 15 s: a stopped rank is named at once, never waited out.
    assert "no stacks within" not in shown


def _state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    return next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))


def test_what_a_sigkill_leaves_goes_at_the_next_start(tmp_path: Path) -> None:
    """distrun and its agent killed with SIGKILL leave the control socket and the agent's dump directory;
    the next distrun of this user removes both, and a live job's stay."""
    env = _own_runtime(tmp_path)
    sockets = Path(env["XDG_RUNTIME_DIR"]) / "distrun"
    ready = tmp_path / "killed"
    ready.mkdir()
    job = start_distrun("-np", "1", SCRIPTS / "stack_cases.py", ready, "sleep", env=env)
    with never_left_running(job):
        dump_dir, rank, agent = sleeping_rank(ready)
        assert (dump_dir / LOCK_NAME).exists() and (sockets / f"{job.pid}.sock").exists()
        os.kill(agent, signal.SIGKILL)
        os.kill(job.pid, signal.SIGKILL)
        job.communicate(timeout=60)
    wait_until(lambda: _state(rank) in ("", "Z"), 30)
    assert dump_dir.exists() and (sockets / f"{job.pid}.sock").exists(), "what SIGKILL leaves"

    live_ready = tmp_path / "live"
    live_ready.mkdir()
    live = start_distrun("-np", "1", SCRIPTS / "stack_cases.py", live_ready, "sleep", env=env)
    with never_left_running(live):
        live_dir, _, _ = sleeping_rank(live_ready)
        assert not dump_dir.exists(), "the killed agent's directory is removed at the next start"
        assert not (sockets / f"{job.pid}.sock").exists(), (
            "the killed job's socket is removed at the next start"
        )
        done = run_distrun("-np", "1", "true", env=env)
        assert done.returncode == 0, done.stderr.decode()
        assert live_dir.exists() and (sockets / f"{live.pid}.sock").exists(), "a live job's stay"


def test_an_xdg_runtime_dir_of_another_user_falls_back_to_the_per_uid_directory(tmp_path: Path) -> None:
    """`su`/`sudo -u` keep the first user's XDG_RUNTIME_DIR: the job still gets its socket, `distrun stacks`
    finds it, and neither prints a traceback."""
    others = tmp_path / "run-user-other"
    others.mkdir(mode=0o700)
    os.chown(others, 65534, 65534)
    env = clean_env(XDG_RUNTIME_DIR=str(others))
    job = start_distrun("-np", "2", SCRIPTS / "sleepers.py", tmp_path, env=env)
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        shown = ask_stacks_until(job.pid, "verdict:", env)
        assert "rank 1 (1 of 2) on localhost:" in shown
        assert Path(f"/tmp/distrun-{os.getuid()}/{job.pid}.sock").exists()
        missing = subprocess.run(
            distrun_argv("stacks", "999999999"), capture_output=True, env=env, timeout=60
        )
    assert missing.returncode == 1
    assert missing.stderr.decode() == "distrun: error: no distrun job of yours with pid 999999999\n"
    _, err = job.communicate()
    assert "Traceback" not in err.decode() and "control socket" not in err.decode()
    assert not any(others.iterdir()), "nothing is made in another user's directory"


def test_a_rank_inside_pytest_shows_its_test_not_pytest(tmp_path: Path) -> None:
    env = {**_own_runtime(tmp_path), "READY_DIR": str(tmp_path)}
    out_dir = tmp_path / "logs"
    # Away from this repository: its pytest configuration and conftest.py are not the rank's.
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SCRIPTS / "under_pytest.py", project / "test_under_pytest.py")
    job = start_distrun(
        "-np", "1", "--stack-tool", "python", "--output-dir", out_dir, sys.executable, "-m", "pytest", "-q",
        "-p", "no:cacheprovider", "test_under_pytest.py", env=env, cwd=project,
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 1)
        shown = ask_stacks_until(job.pid, "in test_waits_forever", env)
    lines = [line.strip() for line in shown.splitlines()]
    folds = [line for line in lines if line.startswith("... ") and " in " in line]
    assert any("pytest" in line and "pluggy" in line for line in folds), shown
    assert any(line.endswith(", in test_waits_forever") for line in lines), shown
    assert len(lines) < 20, shown
    # The file keeps every frame: pytest's and pluggy's too.
    written = (out_dir / "stacks-1-request.txt").read_text()
    assert written.count("/_pytest/") + written.count("/pluggy/") >= 10, written
    assert "... " not in written


def test_a_reused_output_dir_names_an_earlier_runs_stacks_and_keeps_them(tmp_path: Path) -> None:
    env = _own_runtime(tmp_path)
    out_dir = tmp_path / "logs"
    out_dir.mkdir()
    for name in ("stacks-1-request.txt", "stacks-2-timeout.txt"):
        (out_dir / name).write_text(f"an earlier run's {name}\n")
    done = run_distrun("-np", "1", "--timeout", "1", "--output-dir", out_dir, "sleep", "60", env=env)
    assert done.returncode == 124, done.stderr.decode()
    assert (
        f"distrun: --output-dir {out_dir}: stacks-1-request.txt, stacks-2-timeout.txt from an earlier run; "
        "left as they are (this job's stacks begin at stacks-3)\n"
    ) in done.stderr.decode()
    assert (out_dir / "stacks-1-request.txt").read_text() == "an earlier run's stacks-1-request.txt\n"
    assert "verdict:" in (out_dir / "stacks-3-timeout.txt").read_text()
