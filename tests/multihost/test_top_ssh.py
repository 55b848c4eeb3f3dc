"""`distrun top` of a job on two SSH hosts of the simulated cluster: the right host for every rank."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import (
    REPO,
    SCRIPTS,
    distrun_argv,
    never_left_running,
    start_distrun,
    wait_for_files,
    wait_until,
)
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


def test_top_after_a_newcomer_joined_on_another_host_lists_the_world_now(
    cluster: Cluster, tmp_path: Path
) -> None:
    """h1 and h2 from the discovery script; h3 once rank 1 opted in: its newcomer (id 2) joins at the next
    commit. top lists the three ranks with their hosts and world ranks; the heading counts 3 on 3 hosts."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\necho h1:1\necho h2:1\n[ -f {out}/opted.1 ] && echo h3:1\nexit 0\n")
    script.chmod(0o755)
    env = cluster.env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime))
    # --allow-mismatch: a host added to a job already on two hosts is refused as a mismatch until a joining
    # host is probed for its software as the first ones are (issue 40, section 2); top is this test's matter.
    job = start_distrun(
        "-np", "2", "--min-np", "2", "--max-np", "3", "--allow-mismatch", "--host-discovery-script", script,
        SCRIPTS / "elastic_train.py", out, "-1", "3", "1000",
        env={**env, "ELASTIC_WAIT_FOR_HOSTS": "1", "ELASTIC_SLOW_S": "0.2"},
    )  # fmt: skip
    with never_left_running(job):
        try:
            wait_for_files(out, "opted.*", 3, timeout=180)
        except AssertionError:
            job.terminate()
            raise AssertionError(job.communicate(timeout=60)[1].decode()[-3000:]) from None

        def world() -> dict[int, dict[str, object]] | None:
            rows = top_json(job.pid, env)
            return rows if [row["state"] for row in rows.values()] == ["running"] * 3 else None

        rows = wait_until(world, timeout=60, what="top to list the three ranks running", every=0.2)
        assert {r: (row["host"], row["world_rank"], row["left"]) for r, row in rows.items()} == {
            0: ("h1", 0, False),
            1: ("h2", 1, False),
            2: ("h3", 2, False),
        }
        table = subprocess.run(distrun_argv("top", "--once", "--job", str(job.pid)), capture_output=True,
                               env=env, timeout=30)  # fmt: skip
        assert table.returncode == 0, table.stderr.decode()
        assert "3 ranks on 3 hosts" in table.stdout.decode().splitlines()[0], table.stdout.decode()
    left = cluster.wait_clean(timeout=30)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
