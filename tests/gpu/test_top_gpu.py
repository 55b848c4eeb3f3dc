"""A busy GPU seen through NVML: `distrun top` shows its utilisation and memory (skipped without CUDA)."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import pytest

from tests.support import REPO, gpu_env, never_left_running, start_distrun, wait_for_files, wait_until
from tests.top_helpers import top_json

pytestmark = pytest.mark.gpu
BUSY = REPO / "tests" / "gpu" / "gpu_busy.py"
MiB = 1 << 20


def _cuda_missing() -> str | None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "tests/gpu: needs CUDA (no libcuda.so.1)"
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return "tests/gpu: needs CUDA (no device)"
    return None


def test_a_busy_gpu_shows_its_utilisation_and_memory(tmp_path: Path) -> None:
    missing = _cuda_missing()
    if missing is not None:
        pytest.skip(missing)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = gpu_env(XDG_RUNTIME_DIR=str(runtime))
    ready = tmp_path / "ready"
    ready.mkdir()
    report = tmp_path / "run.json"
    job = start_distrun(
        "-np", "1", "--sample-interval", "1", "--report", report, BUSY, ready, "30", "1024", env=env
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(ready, "*.pid", 1)
        began = time.monotonic()

        def busy() -> dict[str, object] | None:
            row = top_json(job.pid, env)[0]
            util, memory = row["gpu_util_percent"], row["gpu_memory_bytes"]
            seen = isinstance(util, float) and util > 50 and isinstance(memory, int) and memory >= 1024 * MiB
            return row if seen else None

        row = wait_until(busy, timeout=10, what="top to show the busy GPU", every=0.2)
        print(f"seen after {time.monotonic() - began:.1f}s: {row}")
        assert row["cpu_percent"] is not None
