"""The collective, named, on two SSH hosts of the simulated cluster: rank 3 (on h2) never issues a named
allreduce; `distrun stacks` names it, the tensor and both sequence numbers, and `top` marks it behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import (
    REPO,
    SCRIPTS,
    ask_stacks_until,
    never_left_running,
    start_distrun,
    wait_for_files,
    wait_until,
)
from tests.top_helpers import top_json

pytestmark = pytest.mark.multihost

VERDICT = (
    "verdict: ranks 0-2 wait in allreduce `grad.layer4.weight` (#7, process set 0); rank 3 never issued it: "
    "its last completed is #6; rank 3's stack: data_loader, skip_allreduce.py:18"
)


def test_the_rank_behind_on_another_host_is_named(cluster: Cluster, tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = cluster.env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime))
    ready = tmp_path / "ready"
    ready.mkdir()
    job = start_distrun(
        "-H", "h1:2,h2:2", "--sample-interval", "0.5", SCRIPTS / "skip_allreduce.py", ready, "skip", env=env
    )
    with never_left_running(job):
        wait_for_files(ready, "*.pid", 4)
        shown = ask_stacks_until(job.pid, VERDICT, env)
        assert VERDICT in shown.splitlines(), shown
        assert "rank 3 (1 of 4) on h2:" in shown, shown
        wait_until(lambda: top_json(job.pid, env)[3].get("collectives_behind") == 1, timeout=30,
                   what="top to mark rank 3 one behind")  # fmt: skip
        assert job.poll() is None
    left = cluster.wait_clean(timeout=10)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
