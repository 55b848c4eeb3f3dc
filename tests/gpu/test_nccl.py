"""collectives on GPUs with nccl. Skipped, with the reason, where CUDA is not available."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nccl backend, GPU pinning)"),
]

REPO = Path(__file__).resolve().parents[2]

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


def test_example_on_gpu(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    ranks = min(2, torch.cuda.device_count())
    command = [sys.executable, "-m", "launcher", "-np", str(ranks), str(REPO / "examples" / "train.py")]
    command += ["--epochs", "5", "--checkpoint", str(tmp_path / "ckpt.pt"), "--json-out", str(summary)]
    subprocess.run(command, cwd=REPO, env=_env(), check=True, timeout=600)
    result = json.loads(summary.read_text())
    assert result["ranks"] == ranks
    assert result["test_accuracy"] > 0.9
