"""horovodrun's rank environment on uneven SSH hosts: HOROVOD_CROSS_* count the hosts with a rank at the
same local rank (Horovod's get_host_assignments), and hvd.cross_rank()/cross_size() say the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, run_distrun

pytestmark = pytest.mark.multihost


def test_horovod_variables_and_collectives_agree_on_uneven_hosts(cluster: Cluster, tmp_path: Path) -> None:
    result = run_distrun(
        "-H", "h1:2,h2:1", SCRIPTS / "horovod_env.py", tmp_path,
        env=cluster.env(PYTHONPATH=str(REPO)), timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    got = {rank: json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(3)}
    # rank, size, local rank, local size, cross rank, cross size, host
    expected = {0: (0, 3, 0, 2, 0, 2, "h1"), 1: (1, 3, 1, 2, 0, 1, "h1"), 2: (2, 3, 0, 1, 1, 2, "h2")}
    for rank, values in expected.items():
        names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
        assert {name: got[rank][f"HOROVOD_{name}"] for name in names} == dict(
            zip(names, map(str, values), strict=True)
        ), f"rank {rank}"
        assert got[rank]["hvd"] == list(values[:6]), f"rank {rank}"


def test_dry_run_shows_them(cluster: Cluster) -> None:
    shown = run_distrun("--dry-run", "-H", "h1:2,h2:1", "true", env=cluster.env(), timeout=60).stdout.decode()
    assert "    HOROVOD_CROSS_SIZE=1" in shown.splitlines()
