"""A plain torch.distributed script on NCCL: torch's own flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) gives
`distrun stacks` each rank's last collective enqueued and completed, the columns collectives' engine gives.
One GPU, quick (well under a minute). Skipped, with the reason, where CUDA is not available."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from launcher.agent.progress import ANSWER_SOURCE, records_of  # noqa: E402
from tests.support import ask_stacks_until, distrun_argv, gpu_env, never_left_running, wait_for_files  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="tests/gpu: needs CUDA (NCCL's flight recorder)"
    ),
]

# Two all_reduces on NCCL, then the rank writes READY/0.pid and sleeps, as a hung job's rank would.
SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    t = torch.ones(1024, device="cuda")
    for _ in range(2):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    with open(os.path.join(sys.argv[1], "0.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    """
)


def test_the_answer_hook_reads_nccls_flight_recorder_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook the agent plants in every rank, run here: its answer holds torch's trace, and the agent
    turns it into a record of the last collective enqueued (issued) and completed (done)."""
    import torch.distributed as dist

    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "64")
    monkeypatch.delenv("DISTRUN_STACK_DIR", raising=False)  # the hook starts no thread here
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        t = torch.ones(256, device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        hook = types.ModuleType("distrun_progresshook")
        exec(compile(ANSWER_SOURCE, "distrun_progresshook.py", "exec"), hook.__dict__)
        answer = hook._answer()
        assert answer["torch"]["backend"] == "nccl", answer
        records = records_of(answer)
        assert records, answer
        record = next(r for r in records if r["issued"] and r["issued"]["name"].endswith("all_reduce"))
        assert record["source"] == "torch (nccl)"
        assert record["issued"]["seq"] == 3, record
        # Completion is noticed by NCCL's watchdog thread: the last completed is at most the last enqueued.
        assert record["done"] is None or record["done"]["seq"] <= 3, record
    finally:
        dist.destroy_process_group()


def test_distrun_stacks_shows_the_nccl_ranks_last_collectives(tmp_path: Path) -> None:
    script = tmp_path / "nccl_sleep.py"
    script.write_text(SCRIPT)
    env = gpu_env(CUDA_VISIBLE_DEVICES="0", TORCH_NCCL_TRACE_BUFFER_SIZE="64")
    job = subprocess.Popen(
        distrun_argv("-np", "1", sys.executable, script, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    with never_left_running(job, grace=10):
        wait_for_files(tmp_path, "0.pid", 1, timeout=45)
        expect = "collectives: last issued all_reduce `nccl:all_reduce` (#2)"
        shown = ask_stacks_until(job.pid, expect, env, within=30)
        assert expect in shown, shown
        assert "torch (nccl)" in shown, shown
