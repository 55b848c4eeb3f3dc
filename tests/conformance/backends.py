"""One way to run distrun on each backend, for the scenarios every backend must pass (tests/conformance).

A scenario asks for `hosts` x `slots` (a `Layout`) and runs distrun's own options and program through the
backend: `-np` on this machine (one host, hosts x slots ranks), `-H h1:S,h2:S,...` on the simulated SSH
cluster (tests/multihost/cluster.py), `salloc -N H --ntasks-per-node=S distrun ...` on the Slurm cluster
(tests/slurm/cluster.py), where distrun finds its hosts in the allocation and starts its agents with srun.

Every backend's hosts share this machine's process table, so a pid a rank recorded is checked the same way
everywhere; "clean" adds, on a cluster, that each host runs nothing but its daemon (sshd, slurmd).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.multihost.cluster import Cluster
from tests.slurm.cluster import SlurmCluster
from tests.support import (
    REPO,
    assert_all_gone,
    clean_env,
    distrun_argv,
    never_left_running,
    recorded_pids,
    wait_until,
)

# The `backend` fixture's parameters (tests/conformance/conftest.py), each marked with what it needs, so that
# `-m "not multihost and not slurm"` (no root) still runs the local one.
BACKENDS = [
    pytest.param("local", id="local", marks=pytest.mark.integration),
    pytest.param("ssh", id="ssh", marks=pytest.mark.multihost),
    pytest.param("slurm", id="slurm", marks=pytest.mark.slurm),
]


# What Slurm tells a step's task about the step: under distrun, the agent's step, not the rank's job.
STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_LOCALID")


@dataclass(frozen=True)
class Rank:
    """Where one rank runs and the place it has there, as the backend's distrun must tell the rank."""

    host: str
    local_rank: int
    local_size: int
    node_rank: int


@dataclass(frozen=True)
class Layout:
    """`hosts` hosts with `slots` ranks each; a backend with one host runs them all there."""

    hosts: int
    slots: int

    @property
    def size(self) -> int:
        return self.hosts * self.slots


class Job:
    """A distrun started in the background, with the pid of distrun itself (under salloc: salloc's child)."""

    def __init__(self, proc: subprocess.Popen[bytes], distrun_pid: int) -> None:
        self.proc = proc
        self.pid = distrun_pid

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def communicate(self, timeout: float = 120) -> tuple[int, str, str]:
        """Waits for the end: exit code, stdout, stderr."""
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


class Backend:
    """What a scenario needs of a backend; the subclasses say how each one does it."""

    name: str
    # What `lose_host` does, and the words of distrun's summary for that loss (after "reset 1: ").
    loses: str
    # Seconds a job needs to have every rank running: a --timeout below it would end a job still starting.
    startup_s: float
    # Seconds after distrun's end within which every process of its ranks must be gone.
    clean_within: float = 30.0

    def names(self, layout: Layout) -> list[str]:
        """The layout's host names, as distrun and its ranks see them."""
        raise NotImplementedError

    def host_args(self, layout: Layout) -> list[str]:
        """distrun's options that select the layout's hosts and slots."""
        raise NotImplementedError

    def addr(self, host: str) -> str:
        """The address the ranks are told for `host` (in TF_CONFIG's workers, but rank 0's host's)."""
        raise NotImplementedError

    def master_addr(self, host: str) -> str:
        """MASTER_ADDR when rank 0 runs on `host` (TF_CONFIG names that host so too)."""
        return self.addr(host)

    def socket_ifname(self) -> str:
        """GLOO_SOCKET_IFNAME, as the ranks must see it."""
        raise NotImplementedError

    def env(self, **extra: str) -> dict[str, str]:
        """distrun's environment on this backend, with this repository on PYTHONPATH."""
        raise NotImplementedError

    def check_env(self, envs: list[dict[str, str]], layout: Layout) -> None:
        """What the backend adds to the ranks' environments (`envs`, by rank), beyond distrun's contract."""

    def argv(self, layout: Layout, *args: str | os.PathLike[str]) -> list[str]:
        """The whole command line that runs `distrun ARGS` on the layout's hosts."""
        return distrun_argv(*self.host_args(layout), *args)

    def ranks(self, layout: Layout) -> list[Rank]:
        """Every rank's place: ranks fill the hosts in order, `slots` on each."""
        names = self.names(layout)
        per_host = layout.size // len(names)
        return [Rank(names[r // per_host], r % per_host, per_host, r // per_host) for r in range(layout.size)]

    def run(
        self, layout: Layout, *args: str | os.PathLike[str], timeout: float = 180, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(layout, *args),
            capture_output=True,
            text=True,
            env=self.env(**extra),
            cwd=REPO,
            timeout=timeout,
        )

    @contextlib.contextmanager
    def start(self, layout: Layout, *args: str | os.PathLike[str], **extra: str) -> Iterator[Job]:
        """distrun in the background for the with-block; still running after it, it is stopped as a user
        would (SIGTERM, then SIGKILL)."""
        proc = subprocess.Popen(
            self.argv(layout, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env(**extra),
            cwd=REPO,
        )
        with never_left_running(proc):
            yield Job(proc, self.distrun_pid(proc))
            if proc.poll() is None:
                os.kill(self.distrun_pid(proc), signal.SIGTERM)

    def distrun_pid(self, proc: subprocess.Popen[bytes]) -> int:
        return proc.pid

    @contextlib.contextmanager
    def lose_host(self, job: Job, layout: Layout, pid_dir: Path) -> Iterator[str]:
        """The layout's last host is lost for the with-block (its link cut; on this machine, which has one
        host, its last rank killed); yields the host. After the block the host is back and emptied."""
        raise NotImplementedError
        yield ""

    def assert_clean(self, pid_dir: Path | None = None) -> None:
        """Every process a rank recorded in `pid_dir` is gone, and every host runs only its daemon."""
        if pid_dir is not None:
            assert_all_gone(recorded_pids(pid_dir), within=self.clean_within)


class Local(Backend):
    name = "local"
    loses = "rank {rank} (host localhost) was killed by SIGKILL"
    startup_s = 3.0
    clean_within = 1.0

    def names(self, layout: Layout) -> list[str]:
        return ["localhost"]

    def host_args(self, layout: Layout) -> list[str]:
        return ["-np", str(layout.size)]

    def addr(self, host: str) -> str:
        return "127.0.0.1"

    def socket_ifname(self) -> str:
        return "lo"

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(**extra)

    @contextlib.contextmanager
    def lose_host(self, job: Job, layout: Layout, pid_dir: Path) -> Iterator[str]:
        # scripts/elastic_train.py names each rank's pid file after the pid and writes its start rank in it.
        last = str(layout.size - 1)
        (pid,) = [int(p.stem) for p in pid_dir.glob("*.start") if p.read_text() == last]
        os.kill(pid, signal.SIGKILL)
        yield "localhost"


class Ssh(Backend):
    name = "ssh"
    loses = "lost host {host} (no word from it for"
    startup_s = 6.0

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def names(self, layout: Layout) -> list[str]:
        return self.cluster.hosts[: layout.hosts]

    def host_args(self, layout: Layout) -> list[str]:
        return ["-H", ",".join(f"{host}:{layout.slots}" for host in self.names(layout))]

    def addr(self, host: str) -> str:
        return self.cluster.addr(host)

    def socket_ifname(self) -> str:
        return "eth0"

    def env(self, **extra: str) -> dict[str, str]:
        return self.cluster.env(PYTHONPATH=str(REPO), **extra)

    @contextlib.contextmanager
    def lose_host(self, job: Job, layout: Layout, pid_dir: Path) -> Iterator[str]:
        host = self.names(layout)[-1]
        self.cluster.link_down(host)
        try:
            yield host
        finally:
            self.cluster.link_up(host)

    def assert_clean(self, pid_dir: Path | None = None) -> None:
        super().assert_clean(pid_dir)
        left = self.cluster.wait_clean(timeout=self.clean_within)
        assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}


class Slurm(Backend):
    name = "slurm"
    loses = "lost host {host}"
    startup_s = 7.0

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster

    def names(self, layout: Layout) -> list[str]:
        return self.cluster.nodes[: layout.hosts]

    def host_args(self, layout: Layout) -> list[str]:
        raise AssertionError("under Slurm the allocation names the hosts: see argv")

    def argv(self, layout: Layout, *args: str | os.PathLike[str]) -> list[str]:
        return ["salloc", f"-N{layout.hosts}", f"--ntasks-per-node={layout.slots}", *distrun_argv(*args)]

    def addr(self, host: str) -> str:
        return self.cluster.network.addr(host)

    def master_addr(self, host: str) -> str:
        return host  # the name Slurm gives rank 0's node, which resolves on every node

    def socket_ifname(self) -> str:
        return "eth0"

    def env(self, **extra: str) -> dict[str, str]:
        return self.cluster.env(PYTHONPATH=str(REPO), **extra)

    def check_env(self, envs: list[dict[str, str]], layout: Layout) -> None:
        """Each rank's SLURM_* describe the job; "task 0 of a 1-task step" (the agent's) would mislead
        libraries that read SLURM_PROCID/SLURM_NTASKS, so the step's are gone and distrun's variables rule."""
        nodes = self.names(layout)
        for env in envs:
            assert env["SLURM_JOB_NODELIST"] == f"{nodes[0][:-2]}[{nodes[0][-2:]}-{nodes[-1][-2:]}]"
            assert env["SLURM_JOB_ID"] == envs[0]["SLURM_JOB_ID"]
            step = {name: env[name] for name in STEP_VARIABLES if name in env}
            assert step == {}, step
            # The job's task count where the allocation has one (--ntasks-per-node), never the step's 1.
            assert env.get("SLURM_NTASKS", str(layout.size)) == str(layout.size)

    def distrun_pid(self, proc: subprocess.Popen[bytes]) -> int:
        """salloc runs distrun as its child once the allocation is granted."""

        def child() -> int | None:
            kids = psutil.Process(proc.pid).children()
            return kids[0].pid if kids else None

        return wait_until(child, 60, "salloc to start distrun")

    @contextlib.contextmanager
    def lose_host(self, job: Job, layout: Layout, pid_dir: Path) -> Iterator[str]:
        host = self.names(layout)[-1]
        self.cluster.network.link_down(host)
        try:
            yield host
            # Only slurmstepd waits on the cut node, to report its step to a controller it cannot reach.
            wait_until(lambda: {p.name() for p in self.cluster.processes(host)} <= {"slurmstepd"}, 30)
        finally:
            self.cluster.network.link_up(host)

    def assert_clean(self, pid_dir: Path | None = None) -> None:
        """Besides the nodes, the queue (the next scenario gets its allocation at once), and no sshd anywhere:
        srun alone reached the nodes."""
        super().assert_clean(pid_dir)
        # After a cut link slurmstepd takes a while to report its step to the controller and leave.
        left = self.cluster.wait_clean(timeout=60.0)
        assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
        self.cluster.wait_idle()
        assert not [
            p for n in self.cluster.nodes for p in self.cluster.network.processes(n) if p.name() == "sshd"
        ]
