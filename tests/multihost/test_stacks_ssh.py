"""Every rank's stacks across two SSH hosts of the simulated cluster: `distrun stacks`, then the timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import (
    HANG_VERDICT,
    REPO,
    SCRIPTS,
    ask_stacks_until,
    assert_hang_grouped,
    start_distrun,
    wait_for_files,
)

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
    try:
        wait_for_files(tmp_path, "*.pid", 4)
        shown = ask_stacks_until(job.pid, HANG_VERDICT, env)
        assert shown.startswith("stacks of 4 ranks on 2 hosts:\n"), shown
        assert_hang_grouped(shown, "h2", "h1, h2")
        assert job.poll() is None, "asking for the stacks must not disturb the job"
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    text = err.decode()
    assert job.returncode == 124, text
    at_timeout = text[text.index("distrun: stacks of 4 ranks on 2 hosts (timeout):") :]
    assert_hang_grouped(at_timeout, "h2", "h1, h2")
    assert at_timeout.index(HANG_VERDICT) < at_timeout.index("distrun: timed out after 60s")
    # The start-up timeline: -v names the slowest host of each phase, the report has every host's.
    for phase in ("connected", "agent", "probed", "started", "first output"):
        assert f"distrun: start-up: {phase}: slowest h" in text, text
    timeline = json.loads(report.read_text())["timeline"]
    assert [t["host"] for t in timeline] == ["h1", "h2"]
    for host in timeline:
        assert 0 < host["connected"] <= host["agent"] <= host["probed"] <= host["started"], host
    assert sorted(int(r) for t in timeline for r in t["first_output"]) == [0, 1, 2, 3]
    left = cluster.wait_clean(timeout=10)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
