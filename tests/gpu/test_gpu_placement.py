"""Ranks on GPUs through distrun: own devices (--gpus-per-rank), bound cores, and the gloo fallback.

Skipped, with the reason, where CUDA is not available. What one GPU can show runs on one GPU; nothing here
needs two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, gpu_env

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="tests/gpu: needs CUDA"),
]

TOPOLOGY_WORKER = REPO / "tests" / "integration" / "workers" / "topology_worker.py"

# One rank's view of its placement, after collectives.init(): what it computes on and where it may run.
PLACEMENT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import collectives as hvd

    hvd.init()
    t = torch.ones(2, device=hvd.device())
    json.dump(
        {
            "backend": hvd.backend(),
            "device": str(hvd.device()),
            "device_count": torch.cuda.device_count(),
            "sum": hvd.allreduce(t, op=hvd.Sum).tolist(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "own": os.environ.get("DISTRUN_OWN_GPUS"),
            "cores": sorted(os.sched_getaffinity(0)),
            "omp": os.environ.get("OMP_NUM_THREADS"),
        },
        open(os.path.join(sys.argv[1], f"rank{hvd.rank()}.json"), "w"),
    )
    hvd.shutdown()
    """
)


def distrun(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "launcher", *map(str, args)]
    env = gpu_env()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        env.pop(name, None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def placed(tmp_path: Path, *options: str) -> list[dict[str, Any]]:
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT_SCRIPT)
    proc = distrun(*options, script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]


def test_gpus_per_rank_one_gives_the_rank_its_gpu_and_nccl(tmp_path: Path) -> None:
    (record,) = placed(tmp_path, "--gpus-per-rank", "1", "-np", "1")
    assert (record["backend"], record["device"], record["device_count"]) == ("nccl", "cuda:0", 1)
    assert record["sum"] == [1.0, 1.0]
    assert record["own"] == "1" and record["visible"]


def test_bind_cores_with_a_gpu(tmp_path: Path) -> None:
    (record,) = placed(tmp_path, "--gpus-per-rank", "1", "--bind-cores", "-np", "1")
    assert record["backend"] == "nccl"
    allowed = sorted(os.sched_getaffinity(0))
    # One rank on the host: every allowed core is its share.
    assert record["cores"] == allowed
    assert record["omp"] == str(len(allowed))


def test_more_ranks_than_gpus_fall_back_to_gloo_with_one_warning(tmp_path: Path) -> None:
    ranks = torch.cuda.device_count() + 1
    proc = distrun("-np", ranks, TOPOLOGY_WORKER, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
    assert {r["backend"] for r in records} == {"gloo"}
    assert [r["rank_sum"] for r in records] == [float(sum(range(ranks)))] * ranks
    warnings = [line for line in proc.stderr.splitlines() if "NCCL cannot give each rank its own GPU" in line]
    assert len(warnings) == 1 and warnings[0].startswith("[0] collectives: host "), proc.stderr
    # The launcher saw it coming too, before starting anything: one line for this host.
    ahead = [line for line in proc.stderr.splitlines() if f" {ranks} ranks share " in line]
    assert len(ahead) == 1 and ahead[0].startswith("distrun: host localhost: "), proc.stderr
    assert "Duplicate GPU" not in proc.stderr


def test_gpus_per_rank_beyond_the_hosts_gpus_is_refused_before_anything_starts(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    proc = distrun("--gpus-per-rank", "1", "-np", gpus + 1, "touch", tmp_path / "ran")
    assert proc.returncode == 3
    assert f"ranks 0-{gpus} need 1 GPU each ({gpus + 1}), but it shows {gpus} GPU" in proc.stderr
    assert not (tmp_path / "ran").exists()
