"""Every rank's stacks from real jobs: `distrun stacks`, --timeout, --stall-timeout; stragglers (issue 17).

The test taking `where` runs on two SSH hosts of the simulated cluster too (tests/multihost)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from launcher.agent.stackdump import find_py_spy
from tests.multihost.support import Where
from tests.support import (
    HANG_VERDICT,
    REPO,
    SCRIPTS,
    Limit,
    ask_stacks_until,
    assert_all_gone,
    clean_env,
    hang_stacks_then_timeout,
    never_left_running,
    recorded_pids,
    run_distrun,
    start_distrun,
    wait_for_files,
    with_timeouts,
)

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())


def test_stacks_while_it_runs_then_at_the_timeout(tmp_path: Path, where: Where) -> None:
    env = where.env()
    on = where.either

    def attempt(limit: Limit) -> tuple[str, Path]:
        out = tmp_path / f"t{limit.seconds}"
        out.mkdir()
        # Local: the stacks files too. On SSH hosts (2 ranks on each): the start-up timeline, -v names its
        # phases.
        hosts = where.either(("-np", "4", "--output-dir", out / "logs"), ("-v", "-H", "h1:2,h2:2"))
        job = start_distrun(
            *hosts, *limit.option, "--stack-tool", "python", "--report", out / "run.json",
            SCRIPTS / "hang.py", out, env=env,
        )  # fmt: skip
        text = hang_stacks_then_timeout(
            job, limit, out, hosts=on("1 host", "2 hosts"), rank2_host=on("localhost", "h2"),
            barrier_hosts=on("localhost", "h1, h2"), env=env,
        )  # fmt: skip
        return text, out

    # Four ranks import torch, then `distrun stacks` comes: within 8 s on a machine shared with other tests,
    # so 20 s, else 60.
    text, out = with_timeouts(attempt, 20, 60)
    report = out / "run.json"
    if where.ssh:
        # The start-up timeline: -v names the slowest host of each phase, the report has every host's.
        for phase in ("agent", "probed", "started", "first output"):
            assert f"distrun: start-up: {phase}: slowest h" in text, text
        timeline = json.loads(report.read_text())["timeline"]
        assert [t["host"] for t in timeline] == ["h1", "h2"]
        for host in timeline:
            assert 0 < host["agent"] <= host["probed"] <= host["started"], host
            assert host["connected"] is None or host["connected"] <= host["agent"], host
        assert sorted(int(r) for t in timeline for r in t["first_output"]) == [0, 1, 2, 3]
        where.assert_clean(within=10)
        return
    assert_all_gone(recorded_pids(out))
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert [d["reason"] for d in doc["stacks"]] == ["request", "timeout"]
    assert doc["stacks"][1]["verdict"] == HANG_VERDICT.removeprefix("verdict: ")
    assert [g["ranks"] for g in doc["stacks"][1]["groups"]] == [[2], [0, 1, 3]]
    assert doc["stacks"][1]["groups"][0]["source"] == "faulthandler"
    files = sorted(p.name for p in (out / "logs").glob("stacks-*.txt"))
    assert files == ["stacks-1-request.txt", "stacks-2-timeout.txt"]
    assert HANG_VERDICT in (out / "logs" / "stacks-2-timeout.txt").read_text()


def _py_spy_unusable() -> str | None:
    """Why py-spy cannot read a process here (not installed; ptrace refused), or None."""
    py_spy = find_py_spy()
    if py_spy is None:
        return "py-spy is not installed (pip install py-spy)"
    ready = "import time; print('ready', flush=True); time.sleep(30)"
    with never_left_running(subprocess.Popen([sys.executable, "-c", ready], stdout=subprocess.PIPE)) as child:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        done = subprocess.run([py_spy, "dump", "--pid", str(child.pid)], capture_output=True, timeout=30)
    if done.returncode != 0:
        return f"py-spy cannot read a process here: {done.stderr.decode().strip()[-200:]}"
    return None


def test_py_spy_adds_native_frames(tmp_path: Path) -> None:
    unusable = _py_spy_unusable()
    if unusable is not None:
        pytest.skip(unusable)
    with never_left_running(
        start_distrun("-np", "3", "--stack-tool", "py-spy", SCRIPTS / "sleepers.py", tmp_path)
    ) as job:
        wait_for_files(tmp_path, "*.pid", 3)
        shown = ask_stacks_until(job.pid, "in odd_one_out")
        assert job.poll() is None
    lines = shown.splitlines()
    assert lines[1:3] == ["rank 1 (1 of 3) on localhost:", "  main thread:"], shown
    # py-spy adds the native frames beneath the Python ones: time.sleep's C function, at least.
    odd = lines[: lines.index("ranks 0,2 (2 of 3) on localhost:")]
    assert any(line.strip().startswith("[native]") for line in odd), shown
    assert (
        "verdict: the ranks are in 2 different places, none in a collective; the fewest, rank 1, in "
        "odd_one_out, sleepers.py:12" in lines
    )
    assert_all_gone(recorded_pids(tmp_path))


def test_a_rank_that_is_not_python_is_named_with_the_reason(tmp_path: Path) -> None:
    result = run_distrun("-np", "2", "--timeout", "3", "--stack-tool", "python", "sleep", "30")
    err = result.stderr.decode()
    assert result.returncode == 124, err
    assert "ranks 0-1 (2 of 2) on localhost: cannot read the stacks: not a Python process (sleep)" in err
    assert "verdict: no rank's stack could be read (2 ranks)" in err


def test_a_python_without_the_hook_is_named_and_never_signalled(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    sleeper = "import time; time.sleep(30)"
    result = run_distrun(
        "-np", "1", "--timeout", "3", "--stack-tool", "python", "--report", report,
        sys.executable, "-I", "-c", sleeper,
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 124, err
    assert "rank 0 (1 of 1) on localhost: cannot read the stacks: no stack hook in it" in err
    # -I ignores the environment: no hook, so no signal (it would have killed the rank), only the timeout's.
    assert json.loads(report.read_text())["ranks"][0]["signal"] == "SIGTERM"


def test_a_python_rank_under_a_shell_is_read_where_it_runs() -> None:
    # `; true`: bash must not exec python in its own place, so the rank's own process stays the shell.
    script = "python3 -c 'import time; time.sleep(30)'; true"
    result = run_distrun("-np", "2", "--timeout", "3", "--stack-tool", "python", "bash", "-c", script)
    err = result.stderr.decode()
    assert result.returncode == 124, err
    assert "ranks 0-1 (2 of 2) on localhost:" in err
    assert "verdict: both ranks are at the same place, not in a collective: in <module>, <string>:1" in err


def test_stall_watchdog_fires_once_per_stall(tmp_path: Path) -> None:
    result = run_distrun("-np", "2", "--stall-timeout", "2", SCRIPTS / "quiet_spells.py", "2", "4")
    err = result.stderr.decode()
    assert result.returncode == 0, err
    warning = "no rank has written anything for 2s: a stall?"
    # Once in each quiet spell (a loaded machine may add one while the ranks start, before any output).
    spells = [
        err[err.rindex("] spell 0") : err.index("] spell 1")],
        err[err.rindex("] spell 1") :],
    ]
    for spell in spells:
        assert spell.count(warning) == 1, err
    # Each stall's stacks follow its warning, but reading them takes a while on a loaded machine: the last
    # spell's may come after the ranks' `done`.
    assert err.count("distrun: stacks of 2 ranks on 1 host (stall):") == err.count(warning), err
    assert (
        "verdict: both ranks are at the same place, not in a collective: in <module>, quiet_spells.py:19"
        in err
    )


def test_stall_watchdog_is_quiet_while_progress_is_drawn() -> None:
    result = run_distrun("-np", "2", "--stall-timeout", "2", SCRIPTS / "quiet_spells.py", "2", "3", "--bar")
    err = result.stderr.decode()
    assert result.returncode == 0, err
    drawing = err[err.index("/60 [") :]  # from the first redraw on (off a terminal, redraws become lines)
    assert "stall" not in drawing, err


def test_a_slower_rank_is_named_once_on_the_console_and_in_the_report(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    result = run_distrun(
        "-np", "4", "--straggler-after", "2", "--report", report, SCRIPTS / "paced.py", "50", "0.1", "2", "2"
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    named = [line for line in err.splitlines() if "straggler:" in line]
    assert len(named) == 1, err
    assert (
        named[0].startswith("distrun: straggler: rank 2 on localhost: 0.")
        and "x the median step rate" in named[0]
    )
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert [(s["rank"], s["host"]) for s in doc["stragglers"]] == [(2, "localhost")]
    assert 0.3 < doc["stragglers"][0]["ratio"] < 0.75
    assert [r["progress"]["n"] for r in doc["ranks"]] == [50, 50, 50, 50]


def test_ranks_at_equal_speed_name_nobody(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    result = run_distrun(
        "-np", "4", "--straggler-after", "1", "--report", report, SCRIPTS / "paced.py", "40", "0.1"
    )
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert "straggler" not in err
    assert json.loads(report.read_text())["stragglers"] == []
    header = next(line for line in err.splitlines() if line.startswith("distrun: host "))
    assert header.split()[-1] == "progress", "the account gains each rank's last progress"
    assert err.count("40/40 at ") == 4


def test_distrun_stacks_without_a_job_says_so_in_one_line(tmp_path: Path) -> None:
    result = run_distrun("stacks", env=clean_env(XDG_RUNTIME_DIR=str(tmp_path)))
    assert result.returncode == 1
    assert result.stderr.decode() == "distrun: error: no running distrun job of yours\n"
    assert result.stdout == b""


def test_bad_watch_options_are_one_line_exit_2() -> None:
    for option, value in (("--stall-timeout", "0"), ("--straggler-after", "-5")):
        result = run_distrun("-np", "1", option, value, "true")
        assert result.returncode == 2
        assert result.stderr.decode() == (
            f"distrun: error: {option} must be a positive number of seconds, got {float(value):g}\n"
        )
