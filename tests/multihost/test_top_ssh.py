"""`distrun top` of a job on two SSH hosts of the simulated cluster: the right host for every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, never_left_running, start_distrun, wait_for_files
from tests.top_helpers import assert_told_apart_within, top_json

pytestmark = pytest.mark.multihost


def test_top_tells_ranks_on_two_hosts_apart_with_their_hosts(cluster: Cluster, tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = cluster.env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime))
    ready = tmp_path / "ready"
    ready.mkdir()
    # Ranks 0 (idle) and 1 (spinning) on h1, rank 2 (holding 400 MiB) on h2.
    # Samples every 0.5 s: over SSH, on a loaded machine, two of them (a CPU figure needs two) still come well
    # inside the 3 s that asking may take.
    job = start_distrun(
        "-H", "h1:2,h2:1", "--sample-interval", "0.5", SCRIPTS / "idle_spin_hold.py", ready, env=env
    )
    with never_left_running(job):
        wait_for_files(ready, "*.pid", 3)
        assert_told_apart_within(job.pid, env, 3.0, {0: "h1", 1: "h1", 2: "h2"})
        assert {row["processes"] for row in top_json(job.pid, env).values()} == {1}
    left = cluster.wait_clean(timeout=10)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
