"""Every rank's stacks across two SSH hosts of the simulated cluster: `distrun stacks`, then the timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, hang_stacks_then_timeout, start_distrun

pytestmark = pytest.mark.multihost


def test_stacks_of_ranks_on_two_hosts_while_running_and_at_the_timeout(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = cluster.env(PYTHONPATH=str(REPO))
    report = tmp_path / "run.json"
    job = start_distrun(
        "-v", "-H", "h1:2,h2:2", "--timeout", "60", "--stack-tool", "python", "--report", report,
        SCRIPTS / "hang.py", tmp_path, env=env,
    )  # fmt: skip
    text = hang_stacks_then_timeout(
        job, tmp_path, hosts="2 hosts", rank2_host="h2", barrier_hosts="h1, h2", env=env
    )
    # The start-up timeline: -v names the slowest host of each phase, the report has every host's.
    for phase in ("agent", "probed", "started", "first output"):
        assert f"distrun: start-up: {phase}: slowest h" in text, text
    timeline = json.loads(report.read_text())["timeline"]
    assert [t["host"] for t in timeline] == ["h1", "h2"]
    for host in timeline:
        assert 0 < host["agent"] <= host["probed"] <= host["started"], host
        assert host["connected"] is None or host["connected"] <= host["agent"], host
    assert sorted(int(r) for t in timeline for r in t["first_output"]) == [0, 1, 2, 3]
    left = cluster.wait_clean(timeout=10)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
