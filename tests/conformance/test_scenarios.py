"""What every backend must do, written once and run on each (the `backend` fixture: local, ssh, slurm).

docs/backend.md ("Adding a backend") has the table of these scenarios by backend. "Clean" always means:
every process a rank recorded is gone, and every host of a cluster runs nothing but its daemon.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import jsonschema

from tests.conformance.backends import Backend, Layout
from tests.support import REPO, SCRIPTS, alive, ask_stacks_until, read_until, wait_for_files, wait_until
from tests.top_helpers import top_json

TWO_BY_TWO = Layout(hosts=2, slots=2)
REPORT_SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())


def hosts_said(backend: Backend, layout: Layout) -> str:
    count = len(backend.names(layout))
    return f"{count} host" if count == 1 else f"{count} hosts"


def test_start_environment_and_prefixes(backend: Backend, tmp_path: Path) -> None:
    """A gloo all-reduce over every rank, each line prefixed with its host and rank; and the environment the
    ranks see: their place, one rendezvous, one TF cluster, the launching directory, and what the backend
    adds (`Backend.check_env`)."""
    ranks = backend.ranks(TWO_BY_TWO)
    result = backend.run(TWO_BY_TWO, "--prefix", "host", SCRIPTS / "allreduce.py", tmp_path, "x y")
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("[")) == [
        f"[{where.host}:{rank}] rank {rank} of 4 sum=10 host={where.host}" for rank, where in enumerate(ranks)
    ]
    dumps = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(4)]
    envs = [dump["env"] for dump in dumps]
    workers = json.loads(envs[0]["TF_CONFIG"])["cluster"]["worker"]
    assert len(set(workers)) == 4, "each TF worker needs its own port"
    hosts = len(backend.names(TWO_BY_TWO))
    for rank, (dump, env, where) in enumerate(zip(dumps, envs, ranks, strict=True)):
        assert (dump["cwd"], dump["argv"]) == (str(REPO), ["x y"]), "ranks run in the launching directory"
        assert (env["RANK"], env["WORLD_SIZE"], env["DISTRUN_HOSTNAME"]) == (str(rank), "4", where.host)
        assert env["LOCAL_RANK"] == str(where.local_rank)
        assert env["LOCAL_WORLD_SIZE"] == env["LOCAL_SIZE"] == str(where.local_size)
        assert env["NODE_RANK"] == env["CROSS_RANK"] == str(where.node_rank)
        assert env["CROSS_SIZE"] == str(hosts)
        assert env["MASTER_ADDR"] == backend.master_addr(ranks[0].host)
        assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"] != "29500"
        assert env["GLOO_SOCKET_IFNAME"] == backend.socket_ifname()
        tf = json.loads(env["TF_CONFIG"])
        assert tf["cluster"]["worker"] == workers and tf["task"] == {"type": "worker", "index": rank}
        # Rank 0's host is named by the master address there, each other host by its own address.
        addr = backend.master_addr if where.node_rank == 0 else backend.addr
        assert workers[rank].startswith(addr(where.host) + ":")
    backend.check_env(envs, TWO_BY_TWO)
    backend.assert_clean()


def test_a_failing_rank_ends_the_job_with_its_code(backend: Backend, tmp_path: Path) -> None:
    ranks = backend.ranks(TWO_BY_TWO)
    result = backend.run(
        TWO_BY_TWO, "--grace-period", "3", SCRIPTS / "behave.py", "--pid-dir", tmp_path, "--fail-rank", "3",
        "--code", "7",
    )  # fmt: skip
    err = result.stderr
    assert result.returncode == 7, err
    assert f"rank 3 (host {ranks[3].host}) exited with code 7" in err
    assert "rank 3 is failing on purpose" in err.split("last stderr lines of rank 3:")[1]
    assert "Traceback" not in err
    assert len(list(tmp_path.glob("*.pid"))) == 8, "4 ranks and their 4 grandchildren"
    backend.assert_clean(tmp_path)


def test_stacks_and_top_of_a_running_job_then_ctrl_c(backend: Backend, tmp_path: Path) -> None:
    """`distrun stacks` and `distrun top --once` answer for every rank on its host while the job runs on;
    then Ctrl-C (SIGINT to distrun) stops every rank and distrun exits 130."""
    ranks = backend.ranks(TWO_BY_TWO)
    env = backend.env()
    args = ("--sample-interval", "0.5", SCRIPTS / "behave.py", "--pid-dir", tmp_path)
    with backend.start(TWO_BY_TWO, *args) as job:
        wait_for_files(tmp_path, "*.pid", 8)  # each rank and its grandchild
        read_until(job.proc, b" ready\n", 4)  # each rank's line relayed: distrun knows every rank runs
        shown = ask_stacks_until(job.pid, "behave.py", env)
        assert shown.startswith(f"stacks of 4 ranks on {hosts_said(backend, TWO_BY_TWO)}:\n"), shown
        assert "behave.py" in shown, shown
        # A rank is "starting" until its agent's first sample (every 0.5 s here) reaches distrun.
        rows = wait_until(
            lambda: (got := top_json(job.pid, env)) and {row["state"] for row in got.values()} == {"running"}
            and got, 30, "top to show every rank running",
        )  # fmt: skip
        assert {rank: row["host"] for rank, row in rows.items()} == {r: w.host for r, w in enumerate(ranks)}
        assert job.proc.poll() is None, "asking must not disturb the job"
        job.signal(signal.SIGINT)
        code, _, err = job.communicate(timeout=60)
    assert code == 130, err
    assert "stopped by SIGINT" in err, err
    assert not [line for line in err.splitlines() if line.startswith("Traceback")], "distrun's own"
    backend.assert_clean(tmp_path)


def test_timeout_ends_the_job_with_124_and_the_stacks(backend: Backend, tmp_path: Path) -> None:
    limit = f"{backend.startup_s:g}"
    result = backend.run(TWO_BY_TWO, "--timeout", limit, SCRIPTS / "behave.py", "--pid-dir", tmp_path)
    err = result.stderr
    assert result.returncode == 124, err
    stacks = err.index(f"distrun: stacks of 4 ranks on {hosts_said(backend, TWO_BY_TWO)} (timeout):")
    summary = err.index(f"distrun: timed out after {limit}s; ranks still running were stopped: 0-3")
    assert stacks < summary and "behave.py" in err[stacks:summary], err
    backend.assert_clean(tmp_path)


def test_a_lost_host_leaves_the_survivors_to_reset_in_place(backend: Backend, tmp_path: Path) -> None:
    """An elastic job (--min-np 2, scripts/elastic_train.py) on 3 hosts loses its last one mid-run (on this
    machine: its last rank is killed); the others go on in a world of 2, in their own processes, with equal
    weights, and no whole-job restart; the summary and the report say so. The group timeout (600 s) is far
    beyond the test's: only the loss being noticed ends the survivors' wait."""
    layout = Layout(hosts=3, slots=1)
    out, report = tmp_path / "out", tmp_path / "report.json"
    out.mkdir()
    with backend.start(
        layout, "--min-np", "2", "--ssh-keepalive", "0.5", "--report", report,
        SCRIPTS / "elastic_train.py", out, "-1", "0", "20",
        ELASTIC_SLOW_S="0.2", ELASTIC_TIMEOUT_S="600",
    ) as job:  # fmt: skip
        wait_for_files(out, "opted.*", 3, timeout=240)
        with backend.lose_host(job, layout, out) as host:
            lost = time.monotonic()
            code, _, err = job.communicate(timeout=200)
            ended = time.monotonic() - lost
    assert code == 0, err
    pids = {int(p.read_text()): int(p.stem) for p in out.glob("*.start")}
    results = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]
    for rank, got in enumerate(results):
        assert (got["rank"], got["size"], got["horovod_size"], got["batch"], got["sizes"]) == (
            rank,
            2,
            "2",
            20,
            [2],
        )
        assert got["pid"] == pids[rank], "the survivor kept its process"
    assert results[0]["weights"] == results[1]["weights"]
    assert not (out / "2.json").exists()
    line = next(line for line in err.splitlines() if "reset 1:" in line)
    assert "reset 1: " + backend.loses.format(host=host, rank=2) in line, line
    assert f"left: rank 2 (on {host}); joined: none; world size 2" in line, line
    assert "1 reset in place" in err
    assert "attempt 1" not in err, "no whole-job restart"
    assert ended < 120, f"the job ended {ended:.0f}s after the loss"
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["restarts"] == 0
    [reset] = doc["resets"]
    assert (reset["ranks_left"], reset["hosts_left"], reset["size"]) == ([2], [host], 2)
    assert reset["recovery_s"] > 0
    backend.assert_clean()
    assert alive(list(pids.values())) == []
