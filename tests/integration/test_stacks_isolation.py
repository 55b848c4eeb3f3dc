"""No failure of a diagnosis path ends a real job (issue 38, item 1): a py-spy whose output is garbled, ranks
that answer the stack signal with garbage, and a launcher whose verdict, live view or straggler watch raises
(tests/integration/scripts/faulty_distrun.py). Each time the job runs on: `distrun stacks` and `distrun top`
answer, the job exits 0 once released, and --timeout exits 124 with the stacks that were read. In-process:
tests/unit/test_diagnosis_isolation.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import (
    REPO,
    SCRIPTS,
    Limit,
    ask_stacks_until,
    clean_env,
    distrun_argv,
    never_left_running,
    wait_for_files,
    with_timeouts,
)

SCRIPT = SCRIPTS / "idle_threads.py"
IDLE = "verdict: both ranks are at the same place, not in a collective: in idle, idle_threads.py:27"
# --timeout of the jobs asked for their stacks first: ranks without torch idle within seconds, and each ask
# takes one; a loaded machine gets the second (tests/support.with_timeouts).
TIMEOUTS = (8, 20)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return clean_env(XDG_RUNTIME_DIR=str(runtime), **extra)


def _faulty(fault: str, *args: str | os.PathLike[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(SCRIPTS / "faulty_distrun.py"), fault, *map(str, args)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)


def _fake_py_spy(tmp_path: Path, output: str) -> str:
    """A directory holding a `py-spy` that prints `output` for any dump, to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "py-spy"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    fake.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def _released(job: subprocess.Popen[bytes], out: Path) -> str:
    (out / "release").write_text("")
    _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    return err.decode()


def test_a_py_spy_with_garbled_output_ends_nothing(tmp_path: Path) -> None:
    """JSON of the wrong shape from py-spy: each rank is read with what can be read of it."""
    env = _env(tmp_path, PATH=_fake_py_spy(tmp_path, '[7, {"frames": [1, {"name": null, "line": "x"}]}]'))
    job = subprocess.Popen(
        distrun_argv("-np", "2", "--stack-tool", "py-spy", SCRIPT, tmp_path, "threads"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        shown = ask_stacks_until(job.pid, "verdict: ", env)
        assert shown.startswith("stacks of 2 ranks on 1 host:\n"), shown
        assert "ranks 0-1 (2 of 2) on localhost:" in shown, shown
        assert job.poll() is None
        _released(job, tmp_path)


def test_ranks_answering_with_a_garbled_dump_end_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path)

    def attempt(limit: Limit) -> str:
        out = tmp_path / f"t{limit.seconds}"
        out.mkdir()
        job = subprocess.Popen(
            distrun_argv("-np", "2", "--stack-tool", "python", *limit.option, SCRIPT, out, "garbled"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
        )  # fmt: skip
        with never_left_running(job):
            with limit.before_it(job):
                wait_for_files(out, "*.pid", 2, timeout=limit.seconds)
                shown = ask_stacks_until(job.pid, "verdict: ", env)
                assert "ranks 0-1 (2 of 2) on localhost:" in shown, shown
            _, raw = job.communicate(timeout=limit.seconds + 60)
        err = raw.decode()
        assert job.returncode == 124, err
        return err

    err = with_timeouts(attempt, *TIMEOUTS)
    assert "distrun: stacks of 2 ranks on 1 host (timeout):" in err and "verdict: " in err, err
    assert "Traceback" not in err


def test_a_verdict_that_raises_leaves_distrun_stacks_and_the_timeout_the_stacks_as_read(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path)
    failed = "distrun stacks' grouping failed: RuntimeError: injected"

    def attempt(limit: Limit) -> tuple[str, int]:
        out = tmp_path / f"t{limit.seconds}"
        out.mkdir()
        job = _faulty("verdict", "-np", "2", *limit.option, SCRIPT, out, "threads", env=env)
        with never_left_running(job):
            with limit.before_it(job):
                wait_for_files(out, "*.pid", 2, timeout=limit.seconds)
                shown = ask_stacks_until(job.pid, f"verdict: none ({failed})", env)
                head = ["stacks of 2 ranks on 1 host:", "rank 0 on localhost:", "  main thread:"]
                assert shown.splitlines()[:3] == head, shown
                assert shown.count(", in idle") == 2 and shown.count(", in helper_polls") == 2, shown
            _, raw = job.communicate(timeout=limit.seconds + 60)
        assert job.returncode == 124, raw.decode()
        return raw.decode(), limit.seconds

    err, seconds = with_timeouts(attempt, *TIMEOUTS)
    at_timeout = err[err.index("distrun: stacks of 2 ranks on 1 host (timeout):") :]
    assert at_timeout.count(", in idle") == 2, err
    ended = at_timeout.index(f"distrun: timed out after {seconds}s")
    assert at_timeout.index(f"verdict: none ({failed})") < ended, err
    # One line naming the tool and the error, however many gatherings failed.
    assert err.count(f"distrun: {failed}; the job runs on\n") == 1, err
    assert "Traceback" not in err


def test_a_live_view_that_raises_leaves_distrun_top_an_answer_and_the_job_exits_0(tmp_path: Path) -> None:
    env = _env(tmp_path)
    job = _faulty("top", "-np", "2", "--sample-interval", "0.2", SCRIPT, tmp_path, "threads", env=env)
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        top = subprocess.run(
            distrun_argv("top", "--once", "--job", str(job.pid)), capture_output=True, env=env, timeout=60
        )
        assert top.returncode == 0, top.stderr.decode()
        assert "distrun top's live view failed: RuntimeError: injected" in top.stdout.decode()
        assert IDLE in ask_stacks_until(job.pid, IDLE, env)
        err = _released(job, tmp_path)
    assert (
        err.count("distrun: distrun top's live view failed: RuntimeError: injected; the job runs on\n") == 1
    )


def test_a_straggler_watch_that_raises_on_every_line_ends_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "faulty_distrun.py"), "stragglers", "-np", "2", SCRIPTS / "paced.py",
         "20", "0.01"],
        capture_output=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.count("distrun: the straggler watch failed: RuntimeError: injected; the job runs on\n") == 1
    assert err.count("20/20") >= 2, "both ranks ran to their end"
