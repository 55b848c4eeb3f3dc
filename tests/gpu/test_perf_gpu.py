"""`distrun check --perf` on a GPU machine: the GEMM figure against the datasheet's order of magnitude, and
the NCCL path of the measurement on one GPU. Skipped, with the reason, where CUDA is not available."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, distrun_argv, gpu_env

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Dense bf16 matrix products, TFLOP/s: the datasheets say ~990 (H100 SXM), ~756 (H100 PCIe), ~312 (A100);
# a large GEMM reaches well over half of that. Other GPUs: at least a few TFLOP/s.
DATASHEET_TFLOPS = {"H100": (200.0, 1000.0), "H200": (200.0, 1000.0), "A100": (100.0, 320.0)}


def perf_report(tmp_path: Path) -> dict[str, object]:
    report = tmp_path / "perf.json"
    result = subprocess.run(
        distrun_argv("check", "--perf", "--report", str(report)),
        capture_output=True,
        text=True,
        env=gpu_env(),
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "perf: nobody named; 1 host measured" in result.stdout
    perf = json.loads(report.read_text())["perf"]
    assert isinstance(perf, dict)
    return perf


def test_gemm_figure_is_of_the_datasheets_order(tmp_path: Path) -> None:
    [host] = perf_report(tmp_path)["hosts"]  # type: ignore[misc]
    assert host["backend"] == "nccl", "GPUs are measured with NCCL, as a launch would choose"
    assert len(host["gpus"]) == torch.cuda.device_count()
    for gpu in host["gpus"]:
        assert gpu["dtype"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
        low, high = next(
            (bounds for name, bounds in DATASHEET_TFLOPS.items() if name in gpu["name"]), (1.0, 5000.0)
        )
        assert low <= gpu["tflops"] <= high, gpu
    if torch.cuda.device_count() > 1:
        assert host["intra_host_bps"] > 1e9, "NCCL over a host's GPUs moves GB/s"


def test_nccl_group_on_one_gpu_runs_every_step(tmp_path: Path) -> None:
    """The measurement's NCCL group, its gloo barriers and its result line, with one rank on one GPU."""
    import os
    import socket
    import sys

    from launcher.check.perf import WORKER

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {
        "rounds": [], "link_bytes": 1 << 20, "gpu_link_bytes": 1 << 20, "pings": 3, "link_repeats": 1,
        "repeat_seconds": 0.1, "compute_ranks": [0], "compute_seconds": 0.2, "compute_window": 0.1,
        "intra_bytes": 1 << 20, "allreduce_bytes": 0, "gpu_allreduce_bytes": 0, "timeout": 60,
    }  # fmt: skip
    env = {
        **gpu_env(), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")[:1],
    }  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", WORKER.read_text(), json.dumps(spec)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("DISTRUN-PERF-RESULT "))
    found = json.loads(line.split(" ", 1)[1])
    assert found["backend"] == "nccl" and len(found["gpus"]) == 1 and found["gpus"][0]["tflops"] > 1.0
