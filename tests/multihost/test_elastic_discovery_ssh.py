"""Hosts the discovery script adds and removes while an elastic job runs on SSH hosts (Horovod's "hosts added
and removed" scenario): h2 joins at the ranks' next commit (connected, probed, its newcomer holding rank 0's
state), then h1 leaves (its rank exits 0) and h2's rank finishes alone, as rank 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean
from tests.support import REPO, SCRIPTS, run_distrun

pytestmark = pytest.mark.multihost

SCRIPT = SCRIPTS / "elastic_train.py"


def test_a_host_added_then_the_first_removed_while_the_job_runs(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(2)
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "discover.sh"
    # h1 alone; h2 too once rank 0 opted in; h2 alone once h2's newcomer (rank id 1) opted in.
    script.write_text(
        f"#!/bin/sh\nif [ -f {out}/opted.1 ]; then echo h2:1\n"
        f"elif [ -f {out}/opted.0 ]; then echo h1:1; echo h2:1\nelse echo h1:1\nfi\n"
    )
    script.chmod(0o755)
    done = run_distrun(
        "--min-np", "1", "--max-np", "2", "--host-discovery-script", script, SCRIPT, out, "-1", "3", "40",
        env=lab.env(PYTHONPATH=str(REPO), ELASTIC_WAIT_FOR_HOSTS="1", ELASTIC_SLOW_S="0.5"), timeout=400,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "reset 1: hosts added: h2 (--host-discovery-script); left: none; joined: h2; world size 2" in err
    assert "reset 2: hosts removed: h1 (--host-discovery-script); left: rank 0 (on h1); joined: none" in err
    got = json.loads((out / "1.json").read_text())
    assert (got["rank"], got["size"], got["batch"], got["sizes"]) == (0, 1, 40, [1])
    assert not (out / "0.json").exists(), "h1's rank left at the commit"
    assert any(line.split()[:4] == ["distrun:", "h1", "0", "0"] for line in err.splitlines()), "it exited 0"
    assert_clean(lab)
