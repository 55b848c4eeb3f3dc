"""--bind-cores and --gpus-per-rank on SSH hosts: the shipped agent reports cores and GPUs, and pins ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean, distrun_on
from tests.support import SCRIPTS

pytestmark = pytest.mark.multihost


def test_bind_cores_pins_remote_ranks_to_disjoint_cores(cluster: Cluster, tmp_path: Path) -> None:
    result = distrun_on(cluster, "-H", "h1:2,h2:1", "--bind-cores", "-v", SCRIPTS / "placement.py", tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    placed = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    h1 = [set(p["cores"]) for p in placed[:2]]
    assert all(h1) and not h1[0] & h1[1], placed
    assert [p["omp"] for p in placed] == [str(len(p["cores"])) for p in placed]
    stderr = result.stderr.decode()
    assert "distrun: host h1: rank 0: cores " in stderr and "distrun: host h2: rank 2: cores " in stderr
    assert_clean(cluster)


def test_a_remote_host_without_gpus_is_refused_before_anything_starts(
    cluster: Cluster, tmp_path: Path
) -> None:
    # -x hides the GPUs on every host, so the hosts show none even where this machine has some.
    args = ("-H", "h1:2,h2:1", "--gpus-per-rank", "1", "-x", "CUDA_VISIBLE_DEVICES=")
    result = distrun_on(cluster, *args, SCRIPTS / "placement.py", tmp_path)
    assert result.returncode == 3
    assert result.stderr.decode() == (
        "distrun: error: host h1: ranks 0-1 need 1 GPU each (2), but it shows 0 GPUs (none) with "
        "CUDA_VISIBLE_DEVICES=''\n"
    )
    assert list(tmp_path.glob("rank*.json")) == []
    assert_clean(cluster)
