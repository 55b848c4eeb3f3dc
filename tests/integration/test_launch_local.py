"""The launcher on one machine, end to end: real distrun, real workers, real torch.distributed groups.

The tests taking `where` run the same scenario on SSH hosts of the simulated cluster too (tests/multihost).
Start, a failing rank, Ctrl-C and --timeout are conformance scenarios, run on every backend
(tests/conformance/test_scenarios.py)."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.multihost.support import Where
from tests.support import (
    FAST_DEATH,
    REPO,
    SCRIPTS,
    assert_all_gone,
    clean_env,
    distrun_argv,
    open_terminal,
    read_terminal,
    read_until,
    recorded_pids,
    run_distrun,
    start_distrun,
    wait_for_files,
)


def _lines(data: bytes) -> list[str]:
    return data.decode().splitlines()


def test_unmodified_torchrun_style_script_runs() -> None:
    result = run_distrun("-np", "3", "python", SCRIPTS / "torchrun_style.py")
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(_lines(result.stdout)) == [f"[{r}] local_rank={r} world=3 max=3" for r in range(3)]


def test_environment_contract(tmp_path: Path) -> None:
    env = clean_env(RANK="99", WORLD_SIZE="99", MASTER_PORT="1", OMP_NUM_THREADS="7", MY_TOKEN="hunter2")
    result = run_distrun(
        "-np", "2", "-x", "EXTRA=a b", "-x", "MY_TOKEN", SCRIPTS / "envdump.py", tmp_path, "x y", env=env
    )
    assert result.returncode == 0, result.stderr.decode()
    dumps = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    envs = [d["env"] for d in dumps]
    for rank, e in enumerate(envs):
        assert e["RANK"] == str(rank) and e["WORLD_SIZE"] == "2"
        assert e["LOCAL_RANK"] == str(rank) and e["LOCAL_WORLD_SIZE"] == e["LOCAL_SIZE"] == "2"
        assert e["NODE_RANK"] == e["GROUP_RANK"] == e["CROSS_RANK"] == "0"
        assert e["GROUP_WORLD_SIZE"] == e["CROSS_SIZE"] == "1"
        assert e["ROLE_RANK"] == str(rank) and e["ROLE_WORLD_SIZE"] == "2" and e["ROLE_NAME"] == "default"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["MASTER_PORT"] != "1" and e["MASTER_PORT"] != "29500"
        assert e["OMP_NUM_THREADS"] == "7"  # the user's own setting wins over the default of 1
        assert e["PYTHONUNBUFFERED"] == "1" and e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["GLOO_SOCKET_IFNAME"] == e["NCCL_SOCKET_IFNAME"] == "lo"
        assert e["EXTRA"] == "a b" and e["MY_TOKEN"] == "hunter2"
        assert e["TORCHELASTIC_RUN_ID"] == e["DISTRUN_RUN_ID"] and e["DISTRUN_HOSTNAME"] == "localhost"
        tf = json.loads(e["TF_CONFIG"])
        assert tf["task"] == {"type": "worker", "index": rank}
        assert dumps[rank]["argv"] == ["x y"]
        assert dumps[rank]["cwd"] == str(REPO)
    workers = json.loads(envs[0]["TF_CONFIG"])["cluster"]["worker"]
    assert workers == json.loads(envs[1]["TF_CONFIG"])["cluster"]["worker"]
    assert len(set(workers)) == 2, "each TF worker needs its own port"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert b"hunter2" not in result.stdout + result.stderr


def test_two_jobs_at_once_get_different_ports(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = start_distrun("-np", "2", SCRIPTS / "envdump.py", a)
    second = start_distrun("-np", "2", SCRIPTS / "envdump.py", b)
    assert first.wait(60) == 0 and second.wait(60) == 0
    port_a = json.loads((a / "0.json").read_text())["env"]["MASTER_PORT"]
    port_b = json.loads((b / "0.json").read_text())["env"]["MASTER_PORT"]
    assert port_a != port_b


def test_summary_names_only_the_ranks_it_stopped(pid_dir: Path) -> None:
    result = run_distrun(
        "-np", "4", SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--exit-early-rank", "0", "--fail-rank", "2",
        "--fail-after-exit-of", "0",  # on a loaded machine rank 0 started late enough to be stopped
    )  # fmt: skip
    assert result.returncode == 5
    # Rank 0 had already exited 0, so it was not stopped.
    assert "rank 2 (host localhost) exited with code 5; stopped ranks 1,3\n" in result.stderr.decode()


def test_rank_killed_by_signal_gives_128_plus_n(pid_dir: Path) -> None:
    result = run_distrun("-np", "2", SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--kill-rank", "1")
    assert result.returncode == 137
    assert "rank 1 (host localhost) was killed by SIGKILL (exit code 137)" in result.stderr.decode()
    assert_all_gone(recorded_pids(pid_dir), within=1.0)


def test_rank_exiting_zero_early_does_not_stop_the_rest(pid_dir: Path) -> None:
    result = run_distrun(
        "-np", "3", SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--exit-early-rank", "0", "--sleep", "1"
    )
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode()
    assert "[0] rank 0 leaving early" in out
    assert "[1] rank 1 done" in out and "[2] rank 2 done" in out
    assert_all_gone(recorded_pids(pid_dir), within=1.0)


def _stop_with(sig: signal.Signals, pid_dir: Path) -> tuple[int, str]:
    """behave.py on 3 ranks, stopped with `sig` once they all run: exit code, stderr."""
    proc = start_distrun("-np", "3", SCRIPTS / "behave.py", "--pid-dir", pid_dir)
    wait_for_files(pid_dir, "*.pid", 6)  # each rank and its grandchild
    read_until(proc, b" ready\n", 3)  # each rank's line relayed: distrun knows every rank runs
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err.decode()


def test_sigterm_stops_every_rank_with_143(pid_dir: Path) -> None:
    code, err = _stop_with(signal.SIGTERM, pid_dir)
    assert code == 143
    assert "stopped by SIGTERM" in err
    assert_all_gone(recorded_pids(pid_dir), within=1.0)


def test_rank_ignoring_sigterm_is_killed_after_the_grace_period(pid_dir: Path) -> None:
    proc = start_distrun(
        "-np", "2", "--grace-period", "1", SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--ignore-term"
    )
    wait_for_files(pid_dir, "rank*.pid", 2)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 130
    assert 0.9 <= elapsed < 5.0, f"grace 1s, but distrun took {elapsed:.2f}s"
    assert_all_gone(recorded_pids(pid_dir), within=1.0)


def test_second_ctrl_c_kills_at_once(pid_dir: Path) -> None:
    proc = start_distrun(
        "-np", "2", "--grace-period", "60", SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--ignore-term"
    )
    wait_for_files(pid_dir, "rank*.pid", 2)
    proc.send_signal(signal.SIGINT)
    read_until(proc, b"Ctrl-C again to kill every rank at once", 1, stderr=True)
    assert proc.poll() is None, "ranks ignore SIGTERM: the first Ctrl-C must still be waiting out the grace"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - sent < 3.0
    assert_all_gone(recorded_pids(pid_dir), within=1.0)


def test_sigkill_of_distrun_leaves_no_rank_behind(pid_dir: Path, where: Where) -> None:
    hosts = where.either(("-np", "3"), ("-H", "h1:2,h2:1"))
    proc = start_distrun(*hosts, SCRIPTS / "behave.py", "--pid-dir", pid_dir, env=where.env())
    wait_for_files(pid_dir, "*.pid", 6)
    if where.cluster is not None:
        assert where.cluster.processes("h1") and where.cluster.processes("h2")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    if where.ssh:
        where.assert_clean(within=5.0)
    else:
        assert_all_gone(recorded_pids(pid_dir), within=5.0)


def test_command_not_found_is_exit_127_with_a_clear_line() -> None:
    result = run_distrun("-np", "2", "no-such-program-xyz")
    assert result.returncode == 127
    err = result.stderr.decode()
    assert "cannot start rank" in err and "no-such-program-xyz" in err
    assert "Traceback" not in err


def test_log_integrity_under_load(tmp_path: Path) -> None:
    ranks, lines = 8, 100_000
    out_dir = tmp_path / "logs"
    result = run_distrun(
        "-np", str(ranks), "--output-dir", out_dir, SCRIPTS / "spam.py", str(lines), timeout=300
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    console = result.stdout.split(b"\n")
    assert console[-1] == b""
    per_rank: dict[int, list[bytes]] = {r: [] for r in range(ranks)}
    line_re = re.compile(rb"^\[(\d+)\] (.*)$", re.S)
    for raw in console[:-1]:
        match = line_re.match(raw)
        assert match, f"line without a rank prefix (split or merged?): {raw[:80]!r}"
        per_rank[int(match.group(1))].append(match.group(2))
    for rank in range(ranks):
        got = per_rank[rank]
        assert len(got) == lines + 4
        expected = [f"r{rank} line {i} ünïcödé ✓".encode() for i in range(lines)]
        assert got[:lines] == expected, f"rank {rank}: lost, duplicated or reordered lines"
        assert got[lines:] == [
            "split ☃ end".encode(),
            b"progress 100%",  # off a terminal, a finished bar is its last state
            b"bad utf8 \xff\xfe here",
            b"final without newline",
        ]
        raw = (out_dir / f"rank.{rank}" / "stdout").read_bytes()
        assert raw.endswith(
            b"progress 10%\rprogress 50%\rprogress 100%\nbad utf8 \xff\xfe here\nfinal without newline"
        )
        assert raw.count(b"\n") == lines + 3
        assert (out_dir / f"rank.{rank}" / "stderr").read_bytes() == b""


def test_closed_console_does_not_stop_the_job(tmp_path: Path) -> None:
    done = tmp_path / "done"
    script = f"for i in range(200000): print(i)\nopen({str(done)!r}, 'w').close()"
    proc = start_distrun("-np", "1", "--output-dir", tmp_path / "logs", "python", "-c", script)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"[0] 0\n"
    proc.stdout.close()  # like `distrun ... | head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "console stdout closed; the job continues" in err and "Traceback" not in err
    assert done.exists()
    assert (tmp_path / "logs" / "rank.0" / "stdout").read_bytes().count(b"\n") == 200000


def test_output_dir_works_for_a_single_process(tmp_path: Path) -> None:
    result = run_distrun(
        "-np",
        "1",
        "--output-dir",
        tmp_path,
        "python",
        "-c",
        "import sys; print('hi'); sys.stderr.write('oops')",
    )
    assert result.returncode == 0
    assert (tmp_path / "rank.0" / "stdout").read_bytes() == b"hi\n"
    assert (tmp_path / "rank.0" / "stderr").read_bytes() == b"oops"
    assert result.stdout == b"[0] hi\n" and result.stderr == b"[0] oops\n"


def test_prefix_modes_rank_filter_and_timestamps() -> None:
    cmd = ("python", "-c", "import os; print('r' + os.environ['RANK'])")
    host = run_distrun("-np", "2", "--prefix", "host", *cmd)
    assert sorted(_lines(host.stdout)) == ["[localhost:0] r0", "[localhost:1] r1"]
    none = run_distrun("-np", "2", "--prefix", "none", *cmd)
    assert sorted(_lines(none.stdout)) == ["r0", "r1"]
    filtered = run_distrun("-np", "4", "--ranks", "0,2-3", *cmd)
    assert sorted(_lines(filtered.stdout)) == ["[0] r0", "[2] r2", "[3] r3"]
    stamped = run_distrun("-np", "1", "--timestamp", *cmd)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} \[0\] r0\n", stamped.stdout.decode())


def test_colours_only_when_asked_or_on_a_tty() -> None:
    cmd = ("python", "-c", "print('x')")
    assert b"\x1b[" not in run_distrun("-np", "1", *cmd).stdout  # a pipe is not a TTY
    assert run_distrun("-np", "1", "--color", *cmd).stdout.startswith(b"\x1b[31m[0]\x1b[0m x")


def test_colours_switch_on_by_themselves_on_a_terminal() -> None:
    parent, child = open_terminal()
    proc = subprocess.Popen(
        distrun_argv("-np", "2", "python", "-c", "print('x')"),
        stdout=child,
        stderr=child,
        env=clean_env(),
        cwd=REPO,
    )
    os.close(child)
    seen = read_terminal(parent)
    os.close(parent)
    assert proc.wait(timeout=60) == 0
    assert b"\x1b[31m[0]\x1b[0m x" in seen and b"\x1b[32m[1]\x1b[0m x" in seen


def test_a_console_that_stops_reading_does_not_fail_the_job(where: Where) -> None:
    # dead_after would be 1.5 s; the console is not read for 3 s while the job runs on. On SSH hosts: h1's
    # rank fills the console pipe, h2's rank is quiet, and neither host may be declared dead meanwhile.
    hosts = where.either(("-np", "2"), ("-H", "h1:1,h2:1"))
    proc = start_distrun(*hosts, *FAST_DEATH, SCRIPTS / "chatty_then_quiet.py", "4", env=where.env())
    time.sleep(3)  # the point: nobody reads the console meanwhile
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.count(b"finished") == 2
    where.assert_clean()


def test_an_agent_killed_outright_takes_its_ranks_with_it(pid_dir: Path) -> None:
    proc = start_distrun(
        "-np", "2", "--grace-period", "30", SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--ignore-term"
    )
    wait_for_files(pid_dir, "rank*.pid", 2)
    agent = psutil.Process(proc.pid).children()[0]
    agent.kill()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err.decode()
    assert "lost host localhost" in err.decode()
    ranks = [int((pid_dir / f"rank{r}.pid").read_text()) for r in range(2)]
    assert_all_gone(ranks, within=2.0)


def test_the_local_agent_has_its_own_session_and_none_of_the_launchers_descriptors(pid_dir: Path) -> None:
    """The local agent is a fork of distrun: it must still lead its own session, and hold no descriptor
    distrun had besides its own three pipes (one kept open would delay or hide another process's EOF)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            distrun_argv("-np", "2", SCRIPTS / "behave.py", "--pid-dir", pid_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(),
            cwd=REPO,
            pass_fds=[write_end],
        )
        os.close(write_end)
        wait_for_files(pid_dir, "rank*.pid", 2)
        agent = psutil.Process(proc.pid).children()[0]
        assert os.getsid(agent.pid) == agent.pid != os.getsid(proc.pid)
        launcher_pipe = os.readlink(f"/proc/{proc.pid}/fd/{write_end}")
        assert launcher_pipe not in [
            os.readlink(f"/proc/{agent.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{agent.pid}/fd")
        ]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        assert_all_gone([agent.pid, *recorded_pids(pid_dir)], within=5.0)
        # Nobody holds the pipe's write end any more: its reader sees EOF.
        assert select.select([read_end], [], [], 10)[0]
        assert os.read(read_end, 1) == b""
    finally:
        os.close(read_end)
