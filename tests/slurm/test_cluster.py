"""The Slurm fixture itself: real daemons, real jobs, and nothing left behind."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from tests.slurm.cluster import SlurmCluster
from tests.support import wait_until

pytestmark = pytest.mark.slurm


def test_srun_reaches_every_node(slurm: SlurmCluster) -> None:
    result = slurm.run(["srun", "-N3", "hostname"])
    assert sorted(result.stdout.split()) == ["node01", "node02", "node03"]
    assert slurm.wait_clean() == {}


def test_allocation_describes_its_nodes(slurm: SlurmCluster) -> None:
    script = "echo $SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE $SLURM_NTASKS"
    result = slurm.run(["salloc", "-N3", "--ntasks-per-node=2", "sh", "-c", script])
    assert result.stdout.split() == ["node[01-03]", "2(x3)", "6"]


def test_teardown_with_a_running_job_leaves_nothing(slurm: SlurmCluster) -> None:
    """A private cluster beside the session one, closed while a job runs on it: none of its processes
    (daemons, slurmstepd, the job's tasks) or namespaces remain, and the session cluster still works."""
    private = SlurmCluster(2)
    hosts = private.network.hosts
    job = subprocess.Popen(["srun", "-N2", "sleep", "600"], env=private.env(), start_new_session=True)
    try:
        wait_until(
            lambda: all(any(p.name() == "sleep" for p in private.processes(n)) for n in private.nodes),
            30,
            "the job's tasks on every node",
        )
        pids = [p.pid for h in hosts for p in private.network.processes(h)]
        private.close()
        assert [ns for ns in map(private.network.netns, hosts) if os.path.exists(f"/run/netns/{ns}")] == []
        assert [pid for pid in pids if psutil.pid_exists(pid)] == []
        assert not private.dir.exists()
    finally:
        private.close()
        job.kill()
        job.wait()
    assert sorted(slurm.run(["srun", "-N3", "hostname"]).stdout.split()) == ["node01", "node02", "node03"]
