"""`distrun stacks` and --timeout with ranks that have threads (issue 38): a script with two helper threads
of different stacks, and an `hvd.elastic` script (its engine's and elastic channel's threads), before and
after a reset in place. Asking never harms the job, which then exits 0; at --timeout the stacks and a
verdict come, exit 124. The verdict is the same at every ask: the ranks idle in their own code are in no
collective, whatever their other threads do. The tests taking `where` run on SSH hosts too (tests/multihost).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.diagnose.stacks import OTHERS_UNREAD
from tests.multihost.support import Where
from tests.support import (
    SCRIPTS,
    Limit,
    ask_stacks_until,
    assert_all_gone,
    never_left_running,
    recorded_pids,
    start_distrun,
    wait_for_files,
    with_timeouts,
)

SCRIPT = SCRIPTS / "idle_threads.py"
IDLE = "are at the same place, not in a collective: in idle, idle_threads.py:27"
# Elastic ranks import torch (and reset) on a machine shared with other tests: the longest wait for them to
# idle, and their --timeout: short on a lightly loaded machine, else generous (tests/support.with_timeouts).
# They idle within 9 s there, or 15-19 s after a reset and three asks for their stacks (over 30 s at a load of
# 5); a middle step, so that a missed first one costs less than the last.
IDLE_WITHIN = 300
IDLE_TIMEOUTS = (20, 60, 150)
RESET_TIMEOUTS = (40, 90, 150)


def _asked_three_times(job: subprocess.Popen[bytes], verdict: str, env: dict[str, str]) -> str:
    """`distrun stacks` until it shows `verdict`, then twice more: the same verdict each time, the job
    running on."""
    shown = ask_stacks_until(job.pid, verdict, env)
    assert verdict in shown, shown
    verdicts = {line for line in shown.splitlines() if line.startswith("verdict: ")}
    for _ in range(2):
        again = ask_stacks_until(job.pid, "verdict: ", env)
        verdicts |= {line for line in again.splitlines() if line.startswith("verdict: ")}
    assert len(verdicts) == 1, verdicts
    assert job.poll() is None, "asking for the stacks must not disturb the job"
    return shown


def _released(job: subprocess.Popen[bytes], out: Path) -> str:
    (out / "release").write_text("")
    _, err = job.communicate(timeout=180)
    assert job.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    return err.decode()


def test_two_threads_stacks_while_it_runs_then_exit_0(tmp_path: Path, where: Where) -> None:
    env = where.env_with_own_runtime(tmp_path)
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))
    job = start_distrun(*hosts, SCRIPT, tmp_path, "threads", env=env)
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        shown = _asked_three_times(job, f"verdict: both ranks {IDLE}", env)
        assert shown.count(", in helper_sleeps") == 1 and shown.count(", in helper_polls") == 1, shown
        _released(job, tmp_path)
    if where.ssh:
        where.assert_clean(within=10)
    else:
        assert_all_gone(recorded_pids(tmp_path))


def test_a_rank_waiting_in_native_code_shows_its_main_thread_and_says_the_others_were_not_read(
    tmp_path: Path,
) -> None:
    """Read with the standard library (no py-spy), a rank whose main thread waits in native code while its
    threads run Python (scripts/native_wait.py): its main thread's stack, and a line saying that the other
    threads were not read and why; the job runs on, then exits 0."""
    env = Where(None).env_with_own_runtime(tmp_path)
    job = start_distrun("-np", "1", "--stack-tool", "python", SCRIPTS / "native_wait.py", tmp_path, env=env)
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 1)
        shown = ask_stacks_until(job.pid, "other threads: ", env)
        assert f"  other threads: {OTHERS_UNREAD}" in shown, shown
        assert shown.count("main thread:") == 1 and ", in wait_in_native" in shown, shown
        assert "in churn" not in shown, shown
        assert job.poll() is None, "asking for the stacks must not disturb the job"
        _released(job, tmp_path)
    assert_all_gone(recorded_pids(tmp_path))


def test_two_threads_at_the_timeout_exit_124_with_stacks_and_a_verdict(tmp_path: Path, where: Where) -> None:
    env = where.env_with_own_runtime(tmp_path)
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))
    for tool in ("auto", "python"):

        def attempt(limit: Limit, tool: str = tool) -> None:
            out = tmp_path / f"{tool}{limit.seconds}"
            out.mkdir()
            job = start_distrun(*hosts, *limit.option, "--stack-tool", tool, SCRIPT, out, "threads", env=env)
            with never_left_running(job):
                with limit.before_it(job):
                    wait_for_files(out, "*.pid", 2, timeout=limit.seconds)
                _, raw = job.communicate(timeout=120)
            err = raw.decode()
            assert job.returncode == 124, err
            assert f"distrun: stacks of 2 ranks on {where.either('1 host', '2 hosts')} (timeout):" in err, err
            assert f"verdict: both ranks {IDLE}" in err, err
            assert err.index("verdict: ") < err.index(f"distrun: timed out after {limit.seconds}s"), err
            assert "Traceback" not in err

        # Ranks without torch idle within seconds (SSH hosts start theirs a little later); else 10 s.
        with_timeouts(attempt, 7, 10)
    where.assert_clean(within=10)


def test_elastic_ranks_stacks_while_they_run_then_exit_0(tmp_path: Path, where: Where) -> None:
    env = where.env_with_own_runtime(tmp_path)
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))
    job = start_distrun(*hosts, SCRIPT, tmp_path, "elastic", env=env)
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2, timeout=IDLE_WITHIN)
        shown = _asked_three_times(job, f"verdict: both ranks {IDLE}", env)
        assert "collectives-engine" in shown, shown
        _released(job, tmp_path)
    where.assert_clean(within=10)


def test_elastic_ranks_at_the_timeout_exit_124_with_stacks_and_a_verdict(
    tmp_path: Path, where: Where
) -> None:
    env = where.env_with_own_runtime(tmp_path)
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))

    def attempt(limit: Limit) -> str:
        out = tmp_path / f"t{limit.seconds}"
        out.mkdir()
        job = start_distrun(*hosts, *limit.option, SCRIPT, out, "elastic", env=env)
        with never_left_running(job):
            with limit.before_it(job):
                wait_for_files(out, "*.pid", 2, timeout=limit.seconds)
            _, raw = job.communicate(timeout=limit.seconds + 60)
        err = raw.decode()
        assert job.returncode == 124, err
        assert f"verdict: both ranks {IDLE}" in err, err
        assert err.index("verdict: ") < err.index(f"distrun: timed out after {limit.seconds}s"), err
        return err

    with_timeouts(attempt, *IDLE_TIMEOUTS)
    where.assert_clean(within=10)


def _survivors_asked(
    job: subprocess.Popen[bytes], out: Path, env: dict[str, str], where: Where, within: float = IDLE_WITHIN
) -> None:
    """Once idle after the reset (`within` seconds): the stacks of the world after it, the survivors only
    (their engine threads may differ: 1 or 2 groups)."""
    wait_for_files(out, "*.pid", 2, timeout=within)
    shown = _asked_three_times(job, f"verdict: both ranks {IDLE}", env)
    assert shown.startswith("stacks of 2 ranks on 1 host:\n"), shown
    first = where.either("localhost", "h1")
    assert f" (1 of 2) on {first}:" in shown or "(2 of 2)" in shown, shown
    assert "rank 2" not in shown and "could not be read" not in shown, shown


@pytest.mark.parametrize("end", ["release", "timeout"])
def test_elastic_ranks_after_a_reset_in_place(tmp_path: Path, where: Where, end: str) -> None:
    """Rank 2 of 3 dies at batch 1; the survivors reset in place and idle: their stacks while they run (the
    rank that left is not named), then the job's end (exit 0 once released; 124 with the stacks at the
    timeout). On SSH hosts rank 2 is h2's one rank."""
    env = where.env_with_own_runtime(tmp_path)
    hosts = where.either(("-H", "localhost:3"), ("-H", "h1:2,h2:1"))

    def start(out: Path, *timeout: str) -> subprocess.Popen[bytes]:
        out.mkdir()
        return start_distrun(
            *hosts, "-np", "3", "--min-np", "2", *timeout, SCRIPT, out, "elastic", "2", "1", env=env
        )  # fmt: skip

    def timed_out(limit: Limit) -> str:
        out = tmp_path / f"t{limit.seconds}"
        job = start(out, *limit.option)
        with never_left_running(job):
            with limit.before_it(job):
                _survivors_asked(job, out, env, where, within=limit.seconds)
            _, raw = job.communicate(timeout=limit.seconds + 60)
        err = raw.decode()
        assert job.returncode == 124, err
        assert f"verdict: both ranks {IDLE}" in err[err.index("(timeout):") :], err
        return err

    if end == "release":
        job = start(tmp_path / "out")
        with never_left_running(job):
            _survivors_asked(job, tmp_path / "out", env, where)
            err = _released(job, tmp_path / "out")
    else:
        err = with_timeouts(timed_out, *RESET_TIMEOUTS)
    assert f"rank 2 (host {where.either('localhost', 'h2')}) was killed by SIGKILL" in err, err
    where.assert_clean(within=10)
