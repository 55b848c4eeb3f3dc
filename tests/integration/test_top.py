"""`distrun top` against real jobs on this machine: JSON rows that tell ranks apart, the table, a real
pseudo-terminal (refresh, `q`), the report's samples and `distrun plot` (the issue of live samples)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from tests.support import (
    REPO,
    SCRIPTS,
    Terminal,
    clean_env,
    distrun_argv,
    never_left_running,
    run_distrun,
    start_distrun,
    wait_for_files,
    wait_until,
)
from tests.top_helpers import MiB, assert_told_apart_within, top_json

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A control directory of the test's own: other jobs of this user are not found, no job means none."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    return clean_env(XDG_RUNTIME_DIR=str(runtime))


@pytest.fixture
def three_ranks(tmp_path: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    ready = tmp_path / "ready"
    ready.mkdir()
    job = start_distrun("-np", "3", SCRIPTS / "idle_spin_hold.py", ready, env=env)
    with never_left_running(job):
        wait_for_files(ready, "*.pid", 3)
        yield job


def test_top_tells_an_idle_a_spinning_and_a_holding_rank_apart(
    three_ranks: subprocess.Popen[bytes], env: dict[str, str]
) -> None:
    assert_told_apart_within(three_ranks.pid, env, 3.0, dict.fromkeys(range(3), "localhost"))
    # The one job of the user is found without --job, as `distrun stacks` finds it.
    assert sorted(top_json(None, env)) == [0, 1, 2]
    table = subprocess.run(distrun_argv("top", "--once"), capture_output=True, env=env, timeout=30)
    assert table.returncode == 0, table.stderr.decode()
    lines = table.stdout.decode().splitlines()
    assert lines[0].startswith(
        f"distrun job {three_ranks.pid}: running its ranks; attempt 0; 3 ranks on 1 host"
    )
    assert lines[2].split()[:3] == ["RANK", "HOST", "STATE"]
    assert [line.split()[0] for line in lines[3:6]] == ["0", "1", "2"]
    assert lines[3].split()[1] == "localhost" and lines[6].split()[:2] == ["localhost", "total"]
    assert "\x1b" not in table.stdout.decode()  # not a terminal: no colours
    assert three_ranks.poll() is None


def test_top_with_no_job_or_a_wrong_one_says_so_in_one_line_as_stacks_does(env: dict[str, str]) -> None:
    for args in (["top", "--once"], ["top", "--once", "--job", "999999999"], ["top"]):
        done = subprocess.run(distrun_argv(*args), capture_output=True, env=env, timeout=30)
        stacks = subprocess.run(distrun_argv("stacks", *args[3:]), capture_output=True, env=env, timeout=30)
        assert done.returncode == stacks.returncode == 1, done.stderr
        lines = done.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distrun: error: no "), lines
    done = subprocess.run(distrun_argv("top", "--json"), capture_output=True, env=env, timeout=30)
    assert done.returncode == 2 and done.stderr.decode() == (
        "distrun: error: top: --json goes with --once (one object per rank, once)\n"
    )


def _table_shown(terminal: Terminal) -> list[str]:
    shown = terminal.shown()
    return shown if any(line.strip().startswith("localhost total") for line in shown) else []


def test_top_in_a_terminal_refreshes_every_second_and_q_quits(
    three_ranks: subprocess.Popen[bytes], env: dict[str, str]
) -> None:
    terminal = Terminal(cols=100, rows=20)
    try:
        before = termios.tcgetattr(terminal.slave)
        top = subprocess.Popen(
            distrun_argv("top", "--job", str(three_ranks.pid)), stdin=terminal.slave, stdout=terminal.slave,
            stderr=terminal.slave, env={**env, "TERM": "xterm"}, start_new_session=True,
        )  # fmt: skip
        with never_left_running(top, grace=5):
            shown = wait_until(lambda: _table_shown(terminal), timeout=30, what="the table on the terminal")
            assert shown[0].startswith(f"distrun job {three_ranks.pid}: running its ranks")
            ranks = [line.split()[0] for line in shown if line.split()[0].isdigit()]
            assert ranks == ["0", "1", "2"], shown
            assert shown[-1] == "q quits"
            assert termios.tcgetattr(terminal.slave)[3] & termios.ICANON == 0  # raw mode while it runs
            # Refreshed in place, about once a second: each table starts from the top-left corner.
            drawn = terminal.raw.count(b"\x1b[H")
            wait_until(lambda: terminal.lines() and terminal.raw.count(b"\x1b[H") >= drawn + 2, timeout=10,
                       what="two more refreshes")  # fmt: skip
            os.write(terminal.master, b"q")
            assert top.wait(timeout=10) == 0
        terminal.lines()
        assert terminal.raw.endswith(b"\x1b[?25h\x1b[?1049l")  # the cursor and the screen given back
        assert termios.tcgetattr(terminal.slave) == before  # and the terminal's mode
        assert three_ranks.poll() is None  # the job goes on
    finally:
        terminal.close()


def test_the_unix_top_still_runs_as_a_command_after_two_dashes() -> None:
    done = run_distrun("-np", "1", "--", "top", "-b", "-n", "1")
    assert done.returncode == 0, done.stderr.decode()
    assert b"[0] top - " in done.stdout and b"load average" in done.stdout
    helped = run_distrun("top", "--help")
    assert b"distrun -np 2 -- top -b -n 1" in helped.stdout


def test_the_report_keeps_each_ranks_samples_and_plot_draws_them(tmp_path: Path, env: dict[str, str]) -> None:
    report = tmp_path / "run.json"
    ready = tmp_path / "ready"
    ready.mkdir()
    began = time.monotonic()
    done = run_distrun("-np", "3", "--report", report, SCRIPTS / "idle_spin_hold.py", ready, "9", env=env)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr.decode()
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["origin"] <= doc["started"]
    for rank in doc["ranks"]:
        times = [s["t"] for s in rank["samples"]]
        assert len(times) >= 4, rank  # ~12 s at one sample every 2 s
        assert times == sorted(times) and times[0] > 0 and times[-1] < took
        assert all(s["gpu_util_percent"] is None and s["steps_per_s"] is None for s in rank["samples"])
    by_rank = {r["rank"]: r["samples"] for r in doc["ranks"]}
    late = {rank: samples[-2] for rank, samples in by_rank.items()}  # every rank in its state by then
    assert late[1]["cpu_percent"] > 5 * max(late[0]["cpu_percent"], late[2]["cpu_percent"], 1.0)
    assert late[2]["rss_bytes"] >= 400 * MiB > 4 * late[0]["rss_bytes"]
    picture = tmp_path / "run.png"
    drawn = run_distrun("plot", report, "-o", picture)
    assert drawn.returncode == 0 and drawn.stdout.decode() == f"wrote {picture}\n", drawn.stderr.decode()
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    pixels = matplotlib.image.imread(picture)
    assert pixels.shape[0] > 400 and pixels.shape[1] > 600
    svg = tmp_path / "run.svg"
    assert run_distrun("plot", report, "-o", svg).returncode == 0
    assert b"<svg" in svg.read_bytes()[:2000]


def test_the_step_rate_of_a_progress_bar_is_sampled(tmp_path: Path, env: dict[str, str]) -> None:
    report = tmp_path / "run.json"
    done = run_distrun(
        "-np", "2", "--sample-interval", "0.5", "--report", report, SCRIPTS / "bar.py", "50", "0.1", env=env
    )
    assert done.returncode == 0, done.stderr.decode()
    for rank in json.loads(report.read_text())["ranks"]:
        rates = [s["steps_per_s"] for s in rank["samples"] if s["steps_per_s"] is not None]
        assert rates and 3 < rates[-1] < 12, rank["samples"]  # 10 steps a second, on a busy machine


def test_no_sampling_leaves_the_report_without_samples(tmp_path: Path, env: dict[str, str]) -> None:
    report = tmp_path / "run.json"
    done = run_distrun(
        "-np", "1", "--sample-interval", "0", "--report", report, SCRIPTS / "bar.py", "5", "0.3", env=env
    )
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(report.read_text())["ranks"][0]["samples"] == []


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "no such file"),
        ("{not json", "not JSON (Expecting property name"),
        ('{"hello": 1}', "not a distrun report (no version, ranks, attempts; see --report)"),
        (
            '{"version": 1, "ranks": [], "attempts": [{"ranks": [{"rank": 0}]}]}',
            "not a distrun report (KeyError",
        ),
    ],
)
def test_plot_of_bad_input_is_one_line_and_exit_2(tmp_path: Path, content: str | None, said: str) -> None:
    source = tmp_path / "run.json"
    if content is not None:
        source.write_text(content)
    done = run_distrun("plot", source, "-o", tmp_path / "run.png")
    err = done.stderr.decode()
    assert done.returncode == 2 and err.startswith(f"distrun: error: plot: {source}: {said}"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run.png").exists()


def test_plot_to_another_format_is_refused(tmp_path: Path) -> None:
    done = run_distrun("plot", tmp_path / "run.json", "-o", tmp_path / "run.pdf")
    assert done.returncode == 2
    assert (
        done.stderr.decode() == f"distrun: error: plot: -o {tmp_path / 'run.pdf'}: name a .png or .svg file\n"
    )


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    source = tmp_path / "run.json"
    source.write_text('{"version": 1, "ranks": [], "attempts": []}')
    # An interpreter where `import matplotlib` fails, as where the extra is not installed.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from launcher.cli.main import main; main(sys.argv[1:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "plot", str(source), "-o", str(tmp_path / "run.png")],
        capture_output=True, env=clean_env(), cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.decode() == (
        'distrun: error: plot needs matplotlib, an optional extra: pip install "distrun[plot]"\n'
    )


def test_top_answers_between_attempts_with_how_the_ranks_ended(env: dict[str, str]) -> None:
    job = start_distrun(
        "-np", "2", "--max-restarts", "1", "--restart-delay", "30", "sh", "-c", "echo hi; exit 3", env=env
    )  # fmt: skip
    with never_left_running(job):

        def restarting() -> list[str]:
            done = subprocess.run(distrun_argv("top", "--once"), capture_output=True, env=env, timeout=30)
            lines = done.stdout.decode().splitlines()
            return lines if lines and "restarting in" in lines[0] else []

        lines = wait_until(restarting, timeout=30, what="top to say the job restarts")
        assert lines[0].startswith(f"distrun job {job.pid}: restarting in ")
        assert [line.split()[:3] for line in lines[3:5]] == [
            ["0", "localhost", "exited"],
            ["1", "exited", "3"],
        ]
        job.terminate()
        job.communicate(timeout=30)


def test_the_status_area_shows_a_line_per_host_on_a_terminal_only(
    tmp_path: Path, env: dict[str, str]
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    terminal = Terminal(cols=120, rows=20)
    try:
        job = subprocess.Popen(
            distrun_argv("-np", "3", "--sample-interval", "0.5", SCRIPTS / "idle_spin_hold.py", ready, "3"),
            stdin=subprocess.DEVNULL, stdout=terminal.slave, stderr=terminal.slave,
            env={**env, "TERM": "xterm"}, cwd=REPO,
        )  # fmt: skip
        with never_left_running(job):
            # The first lines may come while rank 2 still fills its 400 MiB: wait for the line that has it.
            held = "localhost:  CPU min", "RSS max 4"
            line = wait_until(
                lambda: next((s for s in terminal.shown() if s.startswith(held[0]) and held[1] in s), None),
                timeout=60, what="the host line in the status area, with rank 2's memory",
            )  # fmt: skip
            assert "RSS max 4" in line and "(rank 2)" in line, line  # 400-odd MiB, rank 2 holds it
            assert job.wait(timeout=60) == 0
        assert not any(s.startswith("localhost:  CPU min") for s in terminal.shown())  # gone with the attempt
    finally:
        terminal.close()
    piped = run_distrun(
        "-np", "3", "--sample-interval", "0.5", SCRIPTS / "idle_spin_hold.py", ready, "2", env=env
    )
    assert piped.returncode == 0 and b"CPU min" not in piped.stdout + piped.stderr
