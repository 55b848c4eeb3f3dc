"""`distrun check --perf` and `--preflight` on the simulated cluster: a real sshd per host, real
torch.distributed groups (gloo), one host's cable slowed with tc or its CPU share cut with a cgroup."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.multihost.cluster import Cluster, ClusterUnavailable
from tests.multihost.support import SLOW_CABLE
from tests.support import REPO, distrun_argv, never_left_running, wait_until

# They measure the machine: a neighbour test's load would make a healthy host an outlier.
pytestmark = [pytest.mark.multihost, pytest.mark.alone]

# The healthy cluster is measured this many times in a row: nobody may be named in any of them.
HEALTHY_RUNS = 3


def distrun(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        distrun_argv(*args),
        capture_output=True,
        text=True,
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=REPO,
        timeout=timeout,
    )


def perf(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return distrun(cluster, "check", "--perf", "-H", ",".join(cluster.hosts), *args)


def named(result: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    """host -> the kinds of outliers named for it, from the report's words ("h3: link ...: check ...")."""
    found: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        host, _, rest = line.partition(": ")
        kind = rest.split(" ", 1)[0]
        if rest and kind in ("compute", "link", "latency", "GPU", "intra-host"):
            found.setdefault(host, []).append(kind)
    return found


def test_healthy_cluster_names_nobody_run_after_run(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(4)
    for run in range(HEALTHY_RUNS):
        report = tmp_path / f"perf{run}.json"
        result = perf(cluster, "--report", str(report))
        assert result.returncode == 0, f"run {run}:\n{result.stdout}{result.stderr}"
        assert named(result) == {}, result.stdout
        assert "perf: nobody named; 4 hosts measured" in result.stdout.splitlines()[-1]
        document = json.loads(report.read_text())
        assert document["perf"]["outliers"] == []
        assert [h["host"] for h in document["perf"]["hosts"]] == ["h1", "h2", "h3", "h4"]
        assert all(h["compute_gflops"] > 0 and h["link_in_bps"] > 0 for h in document["perf"]["hosts"])


def test_slowed_link_names_that_host_alone(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(4)
    cluster.shape_link("h3", "20mbit")
    report = tmp_path / "perf.json"
    result = perf(cluster, "--report", str(report))
    assert result.returncode == 3, result.stdout + result.stderr
    assert set(named(result)) == {"h3"}, result.stdout
    assert "link" in named(result)["h3"], result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("h3: link "))
    assert "MB/s in" in line and "check its NIC and cable" in line, line
    outliers = json.loads(report.read_text())["perf"]["outliers"]
    link = next(o for o in outliers if o["kind"] == "link")
    assert link["host"] == "h3" and link["unit"] == "B/s"
    assert link["value"] < 4e6 < link["median"], "20 Mbit/s is 2.5 MB/s; the bridge moves far more"


def _has_socket(pid: int) -> bool:
    """Whether the process holds a socket (psutil reads connections in this machine's network namespace,
    not the host's)."""
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        return any(os.readlink(fd).startswith("socket:") for fd in fds.iterdir())
    return False


def test_throttled_cpu_is_named_for_compute(make_cluster: Callable[..., Cluster]) -> None:
    """Everything h2 runs gets 30% of one CPU, and its measurement processes 1% once they have joined their
    group. Every simulated host shares this machine's 2 cores with the others and with other jobs, so a
    healthy host gets anything from a tenth of a core up: only a cap far below that is a throttled host
    here, and at 1% torch's import would take minutes. A process moved a moment late still ran at 30% only,
    which its re-test against a good host, at the same moment, shows."""
    cluster = make_cluster(4)
    sshd = cluster.sshd_pid("h2")
    assert sshd is not None
    try:
        with (
            cluster.cpu_limited("h2", 0.3, "host") as host,
            cluster.cpu_limited("h2", 0.01, "measurement") as measurement,
        ):
            host.add(sshd)  # every session from now on, the agents and their processes
            done = threading.Event()
            moved: set[int] = set()

            def throttle() -> None:
                # The measurement processes of h2 (a first pass, then a re-test) as they join.
                while not done.wait(0.02):
                    for proc in cluster.processes("h2"):
                        with contextlib.suppress(psutil.Error):
                            if proc.pid in moved or "DISTRUN-PERF-RESULT" not in " ".join(proc.cmdline()):
                                continue
                            # Connected to its group's store: torch is imported, and the group waits for
                            # every host before anything is measured.
                            if _has_socket(proc.pid) and measurement.add(proc.pid):
                                moved.add(proc.pid)

            watcher = threading.Thread(target=throttle, daemon=True)
            watcher.start()
            try:
                result = perf(cluster)
            finally:
                done.set()
                watcher.join()
    except ClusterUnavailable as err:
        pytest.skip(str(err))
    assert moved, "h2's measurement processes were throttled"
    assert result.returncode == 3, result.stdout + result.stderr
    assert set(named(result)) == {"h2"}, result.stdout
    assert "compute" in named(result)["h2"], result.stdout


RANK_SCRIPT = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"


def launch(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return distrun(cluster, "--preflight", *args, "python3", "-c", RANK_SCRIPT)


def test_preflight_keeps_a_job_off_a_slow_host(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(4)
    cluster.shape_link("h3", SLOW_CABLE)
    hosts = ",".join(cluster.hosts)
    report = tmp_path / "fixed.json"
    fixed = launch(cluster, "-H", hosts, "--report", str(report))
    assert fixed.returncode == 3, fixed.stdout + fixed.stderr
    assert "rank" not in fixed.stdout, "nothing starts"
    assert "distrun: preflight: h3: link " in fixed.stderr
    assert "preflight named h3; nothing was started" in fixed.stderr
    document = json.loads(report.read_text())
    assert document["outcome"] == "not-started" and document["exit_code"] == 3
    assert [o["host"] for o in document["perf"]["outliers"] if o["kind"] == "link"] == ["h3"]

    elastic = launch(cluster, "-H", hosts, "--min-np", "2", "--report", str(tmp_path / "elastic.json"))
    assert elastic.returncode == 0, elastic.stdout + elastic.stderr
    assert "preflight: leaving out h3; starting 3 ranks on the other hosts" in elastic.stderr
    assert sorted(line.split("] ", 1)[-1] for line in elastic.stdout.splitlines() if "rank" in line) == [
        "rank 0 of 3",
        "rank 1 of 3",
        "rank 2 of 3",
    ]
    assert json.loads((tmp_path / "elastic.json").read_text())["perf"]["outliers"]

    too_few = launch(cluster, "-H", hosts, "--min-np", "4")
    assert too_few.returncode == 3, too_few.stdout + too_few.stderr
    assert "fewer than --min-np 4; nothing was started" in too_few.stderr
    assert "rank" not in too_few.stdout


def test_preflight_on_a_healthy_cluster_starts_the_job(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    result = launch(cluster, "-H", ",".join(cluster.hosts))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "distrun: preflight: nobody named (3 hosts measured in" in result.stderr
    assert len([line for line in result.stdout.splitlines() if "rank" in line]) == 3


def test_host_without_torch_is_a_named_problem(make_cluster: Callable[..., Cluster]) -> None:
    import torch

    cluster = make_cluster(3)
    cluster.hide_path("h2", Path(torch.__file__).parent)
    result = launch(cluster, "-H", ",".join(cluster.hosts), "--min-np", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    problem = next(line for line in result.stderr.splitlines() if "preflight: h2:" in line)
    assert "cannot run the measurement" in problem and "torch" in problem, problem
    assert "fix: pip install torch there" in problem, problem
    assert "preflight: leaving out h2; starting 2 ranks" in result.stderr


def test_blocked_port_is_a_named_problem_not_a_hang(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    cluster.block_tcp("h3", cluster.addr("h1"))
    result = launch(cluster, "-H", ",".join(cluster.hosts))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "distrun: preflight: h3: cannot open a TCP connection to h1:" in result.stderr
    assert "preflight named h3; nothing was started" in result.stderr


def _measuring(cluster: Cluster) -> list[psutil.Process]:
    found = []
    for host in cluster.hosts:
        for proc in cluster.processes(host):
            with contextlib.suppress(psutil.Error):
                if "DISTRUN-PERF-RESULT" in " ".join(proc.cmdline()):
                    found.append(proc)
    return found


def test_ctrl_c_during_the_measurement_stops_every_host(make_cluster: Callable[..., Cluster]) -> None:
    """The measurement is a phase of the job's one loop: Ctrl-C there ends `check --perf` with 130 and stops
    every host's measurement process, as in every other phase."""
    cluster = make_cluster(2)
    argv = distrun_argv("check", "--perf", "-H", ",".join(cluster.hosts))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cluster.env(PYTHONPATH=str(REPO)), cwd=REPO
    )
    with never_left_running(proc):
        wait_until(lambda: len(_measuring(cluster)) == 2, timeout=120, what="both hosts measuring")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert cluster.wait_clean() == {}


def _stopped_measurement(cluster: Cluster, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run distrun with `args`, and SIGSTOP `host`'s measurement process as soon as it exists: it never gets
    past torch's import, so only --timeout can end the measurement. Nothing is left running afterwards."""
    proc = subprocess.Popen(
        distrun_argv(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=REPO,
    )
    with never_left_running(proc):

        def stopped() -> bool:
            for each in cluster.processes(host):
                with contextlib.suppress(psutil.Error):
                    if "DISTRUN-PERF-RESULT" in " ".join(each.cmdline()):
                        each.send_signal(signal.SIGSTOP)
                        return True
            return False

        wait_until(stopped, timeout=120, every=0.01, what=f"{host}'s measurement process")
        out, err = proc.communicate(timeout=300)
    assert cluster.wait_clean() == {}
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def test_timeout_bounds_check_perf_and_names_the_host_that_held_it_up(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(3)
    result = _stopped_measurement(
        cluster, "h2", "check", "--perf", "--timeout", "20", "-H", ",".join(cluster.hosts)
    )
    assert result.returncode == 3, result.stdout + result.stderr
    problems = [line for line in result.stdout.splitlines() if " in time" in line]
    assert [line.split(":", 1)[0] for line in problems] == ["h2"], result.stdout
    assert "perf: 1 named (h2)" in result.stdout.splitlines()[-1], result.stdout


def test_timeout_counts_the_preflight(make_cluster: Callable[..., Cluster]) -> None:
    """--timeout bounds the whole job, its preflight included: a preflight that outlasts it ends the job
    with 124 and nothing started, not a job with a fresh --timeout of its own."""
    cluster = make_cluster(3)
    result = _stopped_measurement(
        cluster,
        "h2",
        "--preflight",
        "--timeout",
        "20",
        "-H",
        ",".join(cluster.hosts),
        "python3",
        "-c",
        RANK_SCRIPT,
    )
    assert result.returncode == 124, result.stdout + result.stderr
    assert "--timeout expired during --preflight; nothing was started" in result.stderr
    assert "rank" not in result.stdout
