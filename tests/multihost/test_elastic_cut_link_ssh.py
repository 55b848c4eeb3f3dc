"""The elastic driver across SSH hosts when a host's link is cut mid-run: the driver drops the silent host
after the --ssh-keepalive limit, the survivors' blocked collectives end at once on `peer_lost` (their groups'
connections are shut down, not left to gloo's timeout), and they finish in the smaller world in their own
processes. Once the link is back, the cut-off host's agent has stopped its rank too."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, never_left_running, start_distrun, wait_for_files

pytestmark = pytest.mark.multihost

SCRIPT = SCRIPTS / "elastic_train.py"
BATCHES = 24


def test_a_cut_hosts_peers_go_on_in_their_processes_long_before_the_groups_timeout(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    # No rank kills itself (victim -1); each batch takes 0.3 s, so the cut, made once all have opted in, lands
    # mid-run (BATCHES: 7 s of them). The group's timeout (600 s) is far beyond the test's: only the cut
    # connections can end the survivors' wait.
    proc = start_distrun(
        "-H", "h1:1,h2:1,h3:1", "--min-np", "2", "--ssh-keepalive", "1", SCRIPT, tmp_path, "-1", "0",
        str(BATCHES),
        env=lab.env(PYTHONPATH=str(REPO), ELASTIC_SLOW_S="0.3", ELASTIC_TIMEOUT_S="600"),
    )  # fmt: skip
    with never_left_running(proc):
        wait_for_files(tmp_path, "opted.*", 3, timeout=240)
        lab.link_down("h3")
        cut = time.monotonic()
        try:
            _, err_bytes = proc.communicate(timeout=200)
            ended = time.monotonic() - cut
        finally:
            lab.link_up("h3")
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    pids = {int(p.read_text()): int(p.stem) for p in tmp_path.glob("*.start")}
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [(got["rank"], got["size"], got["batch"], got["sizes"]) for got in results] == [
        (0, 2, BATCHES, [2]),
        (1, 2, BATCHES, [2]),
    ]
    assert [got["pid"] for got in results] == [pids[0], pids[1]], "the survivors kept their processes"
    assert results[0]["weights"] == results[1]["weights"]
    assert not (tmp_path / "2.json").exists()
    line = next(line for line in err.splitlines() if "reset 1:" in line)
    assert "reset 1: lost host h3 (no word from it for" in line, line
    assert "left: rank 2 (on h3); joined: none; world size 2" in line, line
    assert ended < 120, f"the job ended {ended:.0f}s after the cut"
    assert lab.wait_clean(timeout=30.0) == {}, "the cut-off agent stopped its rank (EOF or its own limit)"
