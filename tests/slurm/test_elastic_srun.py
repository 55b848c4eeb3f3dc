"""The elastic driver inside a Slurm allocation (agents started with srun, no sshd): a node whose link is cut
mid-run is dropped after the heartbeat limit, and the ranks on the other nodes reset in place, keeping their
processes and state, in the smaller world; the cut-off node's agent stops its own rank."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster
from tests.support import REPO, SCRIPTS, distrun_argv, never_left_running, wait_for_files, wait_until

pytestmark = pytest.mark.slurm

SCRIPT = SCRIPTS / "elastic_train.py"


def test_a_lost_node_shrinks_the_world_in_place(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = slurm.env(PYTHONPATH=str(REPO), ELASTIC_SLOW_S="0.3", ELASTIC_TIMEOUT_S="600")
    proc = subprocess.Popen(
        [
            *("salloc", "-N3", "--ntasks-per-node=1"),
            *distrun_argv("--ssh-keepalive", "0.5", "--min-np", "2", SCRIPT, tmp_path, "-1", "0", "40"),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with never_left_running(proc):
        wait_for_files(tmp_path, "opted.*", 3, timeout=240)
        slurm.network.link_down("node03")
        try:
            _, err_bytes = proc.communicate(timeout=200)
            # Only slurmstepd waits on node03, to report its step to a controller it cannot reach.
            wait_until(lambda: {p.name() for p in slurm.processes("node03")} <= {"slurmstepd"}, 30)
        finally:
            slurm.network.link_up("node03")
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    pids = {int(p.read_text()): int(p.stem) for p in tmp_path.glob("*.start")}
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [(got["rank"], got["size"], got["batch"], got["sizes"]) for got in results] == [
        (0, 2, 40, [2]),
        (1, 2, 40, [2]),
    ]
    assert [got["pid"] for got in results] == [pids[0], pids[1]], "the survivors kept their processes"
    assert results[0]["weights"] == results[1]["weights"]
    line = next(line for line in err.splitlines() if "reset 1:" in line)
    assert "reset 1: lost host node03" in line, line
    assert "left: rank 2 (on node03); joined: none; world size 2" in line, line
    assert "attempt 1" not in err, "no whole-job restart"
    left = slurm.wait_clean(timeout=60.0)
    assert left == {}, {node: [p.cmdline() for p in procs] for node, procs in left.items()}
    slurm.wait_idle()
