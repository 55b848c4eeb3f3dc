"""collectives on GPUs with nccl. Skipped, with the reason, where CUDA is not available.

The 2-rank job runs the same worker as the gloo integration tests (it computes on hvd.device()), and the
same checks (tests/collectives_checks.py) judge its results, imported below so that they use this module's
nccl ``job``.
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

torch = pytest.importorskip("torch")

# Collected here by pytest, where they use this module's nccl `job` fixture instead of the gloo one.
from tests.collectives_checks import *  # noqa: E402, F403
from tests.collectives_checks import worker_job  # noqa: E402
from tests.support import REPO  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="tests/gpu: needs CUDA (nccl backend, GPU pinning)"
    ),
]


SINGLE_RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import collectives as hvd

    hvd.init()
    assert hvd.backend() == "nccl", hvd.backend()
    assert torch.cuda.current_device() == hvd.local_rank()
    device = hvd.device()
    t = torch.arange(6.0, device=device).view(3, 2)
    results = {
        "average": hvd.allreduce(t).tolist(),
        "allgather": hvd.allgather(t).shape[0],
        "broadcast_object": hvd.broadcast_object({"ok": 1}),
        "metrics": hvd.average_metrics({"loss": torch.tensor(0.5, device=device)}),
        "reduce_scatter": hvd.reduce_scatter(t).tolist(),
        "alltoall": hvd.alltoall(t).tolist(),
    }
    model = torch.nn.Linear(2, 1).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(sgd, model.named_parameters(), compression=hvd.Compression.fp16)
    model(t).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict())
    hvd.broadcast_optimizer_state(opt)
    results["grad_device"] = str(model.weight.grad.device)
    results["grads"] = [model.weight.grad.tolist(), model.bias.grad.tolist()]
    json.dump(results, open(sys.argv[1], "w"))
    hvd.shutdown()
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def test_nccl_world_size_one(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    subprocess.run(
        [sys.executable, "-c", SINGLE_RANK_SCRIPT, str(out)], cwd=REPO, env=_env(), check=True, timeout=300
    )
    results = json.loads(out.read_text())
    assert results["average"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert results["allgather"] == 3
    assert results["broadcast_object"] == {"ok": 1}
    assert results["metrics"] == {"loss": 0.5}
    assert results["reduce_scatter"] == results["average"] == results["alltoall"]
    assert results["grad_device"].startswith("cuda")
    # d/dw of sum(t @ w.T + b) is the column sums of t, d/db the row count; exact even through fp16.
    assert results["grads"] == [[[6.0, 9.0]], [3.0]]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[Any], Path]:
    """The collectives worker on 2 ranks, one GPU each, with nccl (the default backend under CUDA)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"the 2-rank nccl job needs 2 GPUs; this machine has {torch.cuda.device_count()}")
    return worker_job(2, tmp_path_factory.mktemp("nccl2"), env=_env(), timeout=600)


def test_example_on_gpu(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    ranks = min(2, torch.cuda.device_count())
    command = [sys.executable, "-m", "launcher", "-np", str(ranks), str(REPO / "examples" / "train.py")]
    command += ["--epochs", "5", "--checkpoint", str(tmp_path / "ckpt.pt"), "--json-out", str(summary)]
    subprocess.run(command, cwd=REPO, env=_env(), check=True, timeout=600)
    result = json.loads(summary.read_text())
    assert result["ranks"] == ranks
    assert result["test_accuracy"] > 0.9
