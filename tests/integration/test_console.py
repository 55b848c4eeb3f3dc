"""distrun's console with real ranks: live progress bars, bounded memory, live log files, closed streams."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pyte

from tests.support import (
    REPO,
    SCRIPTS,
    clean_env,
    distrun_argv,
    never_left_running,
    open_terminal,
    run_distrun,
    start_distrun,
    wait_until,
)

SHAPES = REPO / "benchmarks" / "workers" / "shapes.py"
# The target for distrun's own memory, whatever the ranks write.
RSS_LIMIT_MB = 100


def test_redraws_reach_the_console_as_they_happen() -> None:
    proc = start_distrun("-np", "1", "--progress-interval", "0", SCRIPTS / "bar.py", "6", "0.3")
    assert proc.stderr is not None
    arrivals: dict[bytes, float] = {}
    while chunk := proc.stderr.read1(4096):
        now = time.monotonic()
        for state in re.findall(rb"(\d+/6)", chunk):
            arrivals.setdefault(state, now)
    assert proc.wait(timeout=60) == 0
    assert len(arrivals) == 7, arrivals
    times = sorted(arrivals.values())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Written 0.3 s apart: live redraws arrive spread out, not together when the bar ends. A loaded machine
    # may bunch a pair now and then, so most gaps, not every one.
    assert sum(gap >= 0.2 for gap in gaps) >= len(gaps) // 2 + 1, gaps


def _peak_rss_mb(proc: subprocess.Popen[bytes]) -> float:
    peak = 0.0
    watched = psutil.Process(proc.pid)
    with contextlib.suppress(psutil.NoSuchProcess):
        while proc.poll() is None:
            peak = max(peak, watched.memory_info().rss / 1e6)
            time.sleep(0.01)
    return peak


def _relay_to_file(tmp_path: Path, *args: str | os.PathLike[str]) -> tuple[float, bytes]:
    sink = tmp_path / "console"
    with open(sink, "wb") as out:
        proc = subprocess.Popen(distrun_argv(*args), stdout=out, stderr=out, env=clean_env(), cwd=REPO)
        peak = _peak_rss_mb(proc)
    assert proc.wait() == 0
    return peak, sink.read_bytes()


def test_memory_stays_bounded_for_an_endless_line(tmp_path: Path) -> None:
    peak, console = _relay_to_file(tmp_path, "-np", "1", SHAPES, "noline", "50")
    assert peak < RSS_LIMIT_MB, f"distrun's peak RSS {peak:.0f} MB"
    pieces = console.split(b"\n")[:-1]
    assert sum(len(p) - len(b"[0] ") for p in pieces) == console.count(b"x") >= 49_000_000
    assert all(p.startswith(b"[0] x") and len(p) <= 4 + 65536 for p in pieces)


def test_memory_stays_bounded_for_a_million_redraws(tmp_path: Path) -> None:
    peak, console = _relay_to_file(tmp_path, "-np", "1", SHAPES, "redraws", "1000000")
    assert peak < RSS_LIMIT_MB, f"distrun's peak RSS {peak:.0f} MB"
    assert console.endswith(b"[0]  999999/1000000 |####      |\n")


def test_status_area_on_a_real_terminal() -> None:
    parent, child = open_terminal(80, 24)
    proc = subprocess.Popen(
        distrun_argv("-np", "2", SCRIPTS / "bar.py", "30", "0.05"),
        stdout=child,
        stderr=child,
        env=clean_env(TERM="xterm-256color", NO_COLOR="1"),
        cwd=REPO,
    )
    os.close(child)
    screen = pyte.Screen(80, 24)
    stream = pyte.ByteStream(screen)
    both_live = False
    raw = b""
    with contextlib.suppress(OSError):  # EIO once the last writer has closed the terminal
        while chunk := os.read(parent, 4096):
            raw += chunk
            stream.feed(chunk)
            bars = [line for line in screen.display if re.match(r"\[[01]\] +\d+%\|", line)]
            unfinished = [line for line in bars if not line.startswith(("[0] 100%", "[1] 100%"))]
            # Both ranks' bars at once, each on a line of its own: the status area, mid-run.
            both_live = both_live or {line[:3] for line in unfinished} == {"[0]", "[1]"}
    os.close(parent)
    assert proc.wait(timeout=60) == 0
    assert both_live, "never saw both ranks' bars live at the same time"
    final = [line.rstrip() for line in screen.display if line.strip()]
    # Below the ranks' lines and final bars: distrun's end-of-run account.
    assert any(line.startswith("distrun: host") for line in final), final
    assert sorted(line for line in final if line.startswith("[")) == [
        "[0] 100%|##########| 30/30",
        "[0] rank 0 done",
        "[1] 100%|##########| 30/30",
        "[1] rank 1 done",
    ], final
    assert b"\x1b[3" not in raw  # NO_COLOR: no colours, though the cursor moves


def test_output_dir_is_live_and_survives_sigkill_of_distrun(tmp_path: Path) -> None:
    out_dir = tmp_path / "logs"
    proc = start_distrun("-np", "1", "--output-dir", out_dir, SCRIPTS / "live_file.py")
    stdout = out_dir / "rank.0" / "stdout"
    expected = b"line 0\nline 1\nline 2\npartial"
    wait_until(lambda: stdout.exists() and stdout.read_bytes() == expected, 60, f"{expected!r} in {stdout}")
    assert proc.poll() is None, "the job should still be running"
    assert stdout.read_bytes() == expected, "not on disk while the job runs"
    descendants = psutil.Process(proc.pid).children(recursive=True)  # the agent and the rank
    proc.kill()
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(descendants, timeout=30)  # the agent takes its rank down with it
    assert not alive
    assert stdout.read_bytes() == expected


def test_closed_stdout_is_no_traceback_and_keeps_the_exit_code() -> None:
    proc = subprocess.run(
        distrun_argv(
            "-np", "2", "python", "-c", "import os, sys; print('hi'); sys.exit(int(os.environ['RANK']) * 3)"
        ),
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),  # `distrun ... >&-`
        env=clean_env(),
        cwd=REPO,
        timeout=60,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "rank 1" in err


def test_closed_stderr_keeps_the_exit_code() -> None:
    proc = subprocess.run(
        distrun_argv(
            "-np", "1", "python", "-c", "import sys; print('out'); sys.stderr.write('err\\n'); sys.exit(3)"
        ),
        stdout=subprocess.PIPE,
        preexec_fn=lambda: os.close(2),  # `distrun ... 2>&-`
        env=clean_env(),
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stdout == b"[0] out\n"


def test_a_partial_line_on_a_terminal_shows_before_the_line_ends() -> None:
    parent, child = open_terminal(80, 24)
    script = "import sys, time; sys.stdout.write('Loading... '); sys.stdout.flush(); time.sleep(600)"
    proc = subprocess.Popen(
        distrun_argv("-np", "1", "python", "-c", script),
        stdout=child,
        stderr=child,
        env=clean_env(NO_COLOR="1"),
        cwd=REPO,
    )
    os.close(child)
    seen = b""
    stop = threading.Timer(60, proc.kill)
    stop.start()
    try:
        with never_left_running(proc):
            while b"Loading... " not in seen:
                seen += os.read(parent, 4096)
    finally:
        stop.cancel()
        os.close(parent)
    assert b"[0] Loading... " in seen


def test_unfinished_lines_are_written_at_the_end() -> None:
    result = run_distrun("-np", "1", "python", "-c", "import sys; sys.stderr.write('\\r 10%\\r 55%')")
    assert result.returncode == 0
    assert result.stderr == b"[0]  55%\n"


def test_a_negative_progress_interval_is_bad_input() -> None:
    result = run_distrun("--progress-interval", "-1", "true")
    assert result.returncode == 2
    assert (
        result.stderr
        == b"distrun: error: --progress-interval must be zero or a positive number of seconds, got -1\n"
    )


def test_a_slow_console_gets_every_byte_exactly_once() -> None:
    """`distrun -np 2 flood | (sleep; cat)`: two ranks flood 80-byte lines into a pipe nobody reads for
    longer than the progress interval; every byte arrives once, no line cut or repeated."""
    flood = "import sys\nline = b'%s' * 79 + b'\\n'\nfor _ in range(40_000): sys.stdout.buffer.write(line)\n"
    cmd = ("-np", "2", "--progress-interval", "1", "python", "-c")
    proc = start_distrun(*cmd, flood % "x")
    assert proc.stdout is not None and proc.stderr is not None
    time.sleep(3)  # the console is full long before: distrun waits on it, as under `(sleep 3; cat)`
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    lines = out.split(b"\n")
    assert len(out) == 2 * 40_000 * 84, f"{len(out)} bytes instead of {2 * 40_000 * 84}"
    assert set(lines[:-1]) == {b"[0] " + b"x" * 79, b"[1] " + b"x" * 79} and lines[-1] == b""


def test_a_reused_output_dir_names_an_earlier_runs_ranks(tmp_path: Path) -> None:
    result = run_distrun("-np", "4", "--output-dir", tmp_path, "python", "-c", "print('first')")
    assert result.returncode == 0, result.stderr.decode()
    result = run_distrun("-np", "2", "--output-dir", tmp_path, "python", "-c", "print('second')")
    assert result.returncode == 0, result.stderr.decode()
    assert (
        f"distrun: --output-dir {tmp_path}: rank.2, rank.3 from an earlier run (this job has 2 ranks); "
        "left as they are\n"
    ) in result.stderr.decode()
    assert (tmp_path / "rank.1" / "stdout").read_bytes() == b"second\n"
    assert (tmp_path / "rank.3" / "stdout").read_bytes() == b"first\n", "an earlier run's logs are kept"


def test_a_redraw_of_a_huge_count_is_output_not_a_crash(tmp_path: Path) -> None:
    """distrun reads every redraw for its progress (top, the report, stragglers): a count of 5,000 digits,
    more than int() takes, ended distrun with a traceback; 200,000 digits held it for minutes."""
    script = tmp_path / "digits.py"
    script.write_text(
        "import sys\n"
        "for n in (5000, 200_000):\n"
        "    sys.stderr.write('\\r' + '1' * n + '/10 [00:01<00:01, 2.00it/s]\\n')\n"
        "print('done', flush=True)\n"
    )
    result = run_distrun("-np", "2", "--straggler-after", "1", script, timeout=120)
    err = result.stderr.decode()
    assert result.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert result.stdout.decode().count("done") == 2
