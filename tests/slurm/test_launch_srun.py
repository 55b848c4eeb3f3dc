"""distrun inside real Slurm allocations: hosts from Slurm, agents started with srun, no sshd anywhere.

"Clean" always means: every node runs nothing but its slurmd (no agent, rank, slurmstepd or srun task left).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.slurm.cluster import SlurmCluster
from tests.support import (
    REPO,
    SCRIPTS,
    assert_all_gone,
    attempt_world,
    distrun_argv,
    recorded_pids,
    wait_until,
)

pytestmark = pytest.mark.slurm

NODES = ["node01", "node02", "node03"]
RESTARTABLE = SCRIPTS / "restartable.py"


def slurm_env(slurm: SlurmCluster) -> dict[str, str]:
    return slurm.env(PYTHONPATH=str(REPO))


def assert_nodes_clean(slurm: SlurmCluster, within: float = 30.0) -> None:
    left = slurm.wait_clean(timeout=within)
    assert left == {}, {node: [p.cmdline() for p in procs] for node, procs in left.items()}


def assert_clean(slurm: SlurmCluster, within: float = 30.0) -> None:
    """Nothing left on the nodes, and no job left in the queue for the next test to wait behind."""
    assert_nodes_clean(slurm, within)
    slurm.wait_idle()


def salloc(slurm: SlurmCluster, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["salloc", *args], env=slurm_env(slurm), cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_detached_descendants_end_with_the_job_on_every_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    """New sessions, process groups and setsid daemons of ranks in srun steps end with the job (issue 19)."""
    args = ("--grace-period", "1", SCRIPTS / "detach.py", tmp_path)
    result = salloc(slurm, "-N2", *distrun_argv(*args))
    assert result.returncode == 0, result.stderr
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 * 4
    assert_all_gone(pids, within=2.0)
    assert_clean(slurm)


def test_dry_run_inside_an_allocation_shows_the_slurm_nodes(slurm: SlurmCluster) -> None:
    result = salloc(slurm, "-N2", "--ntasks-per-node=2", *distrun_argv("--dry-run", "x.py"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run: 4 processes on 2 hosts; nothing is started"
    assert "launcher: srun" in lines
    assert [line.split()[2] for line in lines if line.startswith("rank ")] == [
        "host=node01",
        "host=node01",
        "host=node02",
        "host=node02",
    ]
    slurm.wait_idle()


def test_sbatch_wait_wrap_runs_distrun_on_the_first_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = tmp_path / "job.out"
    wrap = "hostname; " + shlex.join(distrun_argv("--prefix", "host", SCRIPTS / "allreduce.py"))
    result = subprocess.run(
        ["sbatch", "--wait", "-N3", "--ntasks-per-node=1", f"--output={output}", "--wrap", wrap],
        env=slurm_env(slurm),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    text = output.read_text()
    assert result.returncode == 0, result.stderr + text
    lines = text.splitlines()
    assert lines[0] == "node01", "the batch script (and distrun) runs on the allocation's first node"
    assert sorted(line for line in lines if line.startswith("[")) == [
        f"[{NODES[r]}:{r}] rank {r} of 3 sum=6 host={NODES[r]}" for r in range(3)
    ]
    assert_clean(slurm)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ("--launcher", "srun", "-H", "node09", "hostname"),
            3,
            "distrun: error: host node09: the distrun agent exited before answering: srun: error: "
            "Unable to create step for job [0-9]+: Requested node configuration is not available",
        ),
        (
            ("--python", "/no/python", "x.py"),
            3,
            # Both nodes fail alike; whichever distrun hears of first is named.
            "distrun: error: host node0[12]: the distrun agent exited before answering: "
            "distrun: no Python interpreter found here \\(tried /no/python\\)",
        ),
        (
            ("-np", "5", "hostname"),
            2,
            "distrun: error: requested 5 processes but the hosts provide 2 slots; add --oversubscribe .*",
        ),
    ],
)
def test_bad_launches_under_slurm_are_one_line(
    slurm: SlurmCluster, args: tuple[str, ...], code: int, message: str
) -> None:
    result = salloc(slurm, "-N2", *distrun_argv(*args))
    assert result.returncode == code
    said = [line for line in result.stderr.splitlines() if line.startswith("distrun")]
    assert len(said) == 1 and re.fullmatch(message, said[0]), result.stderr
    assert_clean(slurm)


class Outlived:
    """distrun under salloc on 3 nodes, in the background of a shell that keeps the allocation alive after
    it, so that only distrun's own clean-up, not the end of the job, can stop what it started. As a context:
    waits for the 3 ranks on entry; on exit ends the allocation and waits until the queue is empty."""

    def __init__(self, slurm: SlurmCluster, tmp_path: Path, *args: str | os.PathLike[str]) -> None:
        self.slurm, self.pid_dir = slurm, tmp_path
        self.pid_file, self.code_file = tmp_path / "distrun.pid", tmp_path / "distrun.code"
        pid, code = shlex.quote(str(self.pid_file)), shlex.quote(str(self.code_file))
        shell = f'"$@" & echo $! > {pid}; wait $!; echo $? > {code}; exec sleep 600'
        argv = distrun_argv(*args, SCRIPTS / "behave.py", "--pid-dir", tmp_path)
        self.alloc = subprocess.Popen(
            ["salloc", "-N3", "--ntasks-per-node=1", "sh", "-c", shell, "sh", *argv],
            env=slurm_env(slurm),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def __enter__(self) -> psutil.Process:
        """The distrun process, once all its ranks run."""
        wait_until(lambda: self.pid_file.exists() and len(list(self.pid_dir.glob("rank*.pid"))) == 3)
        return psutil.Process(int(self.pid_file.read_text()))

    def exit_code(self) -> int:
        wait_until(lambda: self.code_file.exists() and self.code_file.read_text().strip() != "")
        return int(self.code_file.read_text())

    def __exit__(self, *exc: object) -> None:
        # salloc runs its command in a process group of its own: end the shell's sleep, and salloc follows.
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in psutil.Process(self.alloc.pid).children(recursive=True):
                proc.kill()
        self.alloc.communicate(timeout=60)
        self.slurm.wait_idle()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGKILL, 137), (signal.SIGTERM, 143)])
def test_killing_distrun_under_slurm_leaves_nothing_on_any_node(
    slurm: SlurmCluster, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """SIGKILL: the agents' connections to distrun close, and each agent sees EOF.
    SIGTERM: distrun stops every rank itself and exits 143."""
    job = Outlived(slurm, tmp_path)
    with job as distrun:
        assert all(slurm.processes(node) for node in NODES)
        assert [p.name() for p in distrun.children()] == ["srun"], "one srun step for every node"
        srun_clients = distrun.children(recursive=True)
        distrun.send_signal(sig)
        assert job.exit_code() == code
        assert_nodes_clean(slurm)
        _, alive = psutil.wait_procs(srun_clients, timeout=10)
        assert alive == [], "srun clients outlived their steps"


def test_sigkill_of_distrun_and_its_srun_clients_leaves_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    """With the srun clients killed too, Slurm (InactiveLimit=0) keeps the steps running. Sometimes slurmstepd
    closes the tasks' stdin when srun's I/O connection drops; where it does not, the agents stop their ranks
    when distrun's heartbeats stop (here after 10 s)."""
    job = Outlived(slurm, tmp_path)
    with job as distrun:
        for proc in [distrun, *distrun.children(recursive=True)]:
            proc.send_signal(signal.SIGKILL)
        assert job.exit_code() == 137
        assert_nodes_clean(slurm, within=60.0)


def test_agents_stop_their_ranks_when_distrun_goes_silent(slurm: SlurmCluster, tmp_path: Path) -> None:
    """distrun stopped (SIGSTOP), its srun clients alive, no EOF anywhere: only the missing heartbeats
    (--ssh-keepalive 1: dead after 5 s) tell the agents, which stop their ranks."""
    job = Outlived(slurm, tmp_path, "--ssh-keepalive", "1")
    with job as distrun:
        ranks = [psutil.Process(int(p.read_text())) for p in tmp_path.glob("rank*.pid")]
        distrun.send_signal(signal.SIGSTOP)
        _, alive = psutil.wait_procs(ranks, timeout=60)
        assert alive == [], "ranks outlived the silence of their launcher"
        assert distrun.status() == psutil.STATUS_STOPPED, "the ranks ended while distrun was still stopped"
        distrun.send_signal(signal.SIGKILL)
        assert job.exit_code() == 137
        assert_nodes_clean(slurm)


def test_max_restarts_under_slurm_restarts_every_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    args = ("--max-restarts", "1", "--restart-delay", "0", RESTARTABLE, "--out", tmp_path, "--fail", "0:4:7")
    result = salloc(slurm, "-N3", "--ntasks-per-node=2", *distrun_argv(*args))
    assert result.returncode == 0, result.stderr
    assert "attempt 0 failed: rank 4 (host node03) exited with code 7; restarting" in result.stderr
    first, second = attempt_world(tmp_path, 0, "MASTER_PORT"), attempt_world(tmp_path, 1, "MASTER_PORT")
    assert [second[rank][:2] for rank in sorted(second)] == [(NODES[r // 2], "6") for r in range(6)]
    assert {port for *_, port in second.values()} != {port for *_, port in first.values()}
    assert_clean(slurm)


def test_a_lost_node_leaves_the_job_which_restarts_smaller(slurm: SlurmCluster, tmp_path: Path) -> None:
    """node03 drops off the network mid-run: distrun misses its heartbeats, names it, and the job goes on
    elastically on node01 and node02; node03's agent, cut off, stops its own ranks."""
    proc = subprocess.Popen(
        [
            *("salloc", "-N3", "--ntasks-per-node=1"),
            *distrun_argv(
                *("--ssh-keepalive", "0.5", "--restart-delay", "0", "--min-np", "2"),
                *(RESTARTABLE, "--out", tmp_path, "--wait-attempt", "0"),
            ),
        ],
        env=slurm_env(slurm),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: len(list(tmp_path.glob("a0.r*.pid"))) == 3)
    slurm.network.link_down("node03")
    try:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "attempt 0 failed: lost host node03" in err
        assert {r: (h, n) for r, (h, n, _) in attempt_world(tmp_path, 1, "MASTER_PORT").items()} == {
            0: ("node01", "2"),
            1: ("node02", "2"),
        }
        # Only slurmstepd waits on node03, to report its step to a controller it cannot reach.
        wait_until(lambda: {p.name() for p in slurm.processes("node03")} <= {"slurmstepd"}, 30)
    finally:
        slurm.network.link_up("node03")
    assert_clean(slurm, within=60.0)


def test_workdir_under_slurm_runs_every_rank_in_the_copy(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The nodes share this machine's disk, so both agents build the same copy at once in one cache: the
    concurrent case of two jobs, which must leave one complete copy that both use."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("import os, mod; print(os.environ['RANK'], os.getcwd(), mod.VALUE)\n")
    (project / "mod.py").write_text("VALUE = 7\n")
    cache = tmp_path / "cache"
    env = {**slurm_env(slurm), "DISTRUN_CACHE_DIR": str(cache)}
    argv = ["salloc", "-N2", *distrun_argv("--workdir", project, "train.py")]
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (copy,) = [p for p in (cache / "workdir" / "trees").iterdir() if p.is_dir()]
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("[")) == [
        f"[{rank}] {rank} {copy} 7" for rank in range(2)
    ]
    # The ranks' bytecode, where Python writes it, stays in the copy (docs/workdir.md).
    assert sorted(set(os.listdir(copy)) - {"__pycache__"}) == ["mod.py", "train.py"]
    assert os.listdir(cache / "workdir" / "tmp") == []
    assert_clean(slurm)


def test_check_inside_an_allocation_reaches_every_node_through_srun(slurm: SlurmCluster) -> None:
    # The nodes run no sshd: only srun steps can reach them, so a ready verdict proves the backend was srun.
    result = salloc(slurm, "-N3", *distrun_argv("check"))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:4]]
    assert [(row[0], row[3]) for row in rows] == [(node, node) for node in NODES]
    assert "ready: all 3 hosts passed" in result.stdout
    assert_clean(slurm)
