"""A peer that dies while a collective is in flight on NCCL: the survivor's engine sees it in its rounds,
aborts the communicator (``collectives.peer_loss``), and the pending operation and every later one raise
HorovodInternalError within seconds, never a hang (NCCL's own timeout is the group's, 30 minutes).

Two ranks need two GPUs: NCCL refuses two ranks on one device. With one GPU, the abort itself is checked on
a one-rank group: an operation after it raises, and leaving does not hang. The same flow on gloo, with the
same worker: tests/integration/test_collectives_engine.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO, start_two_ranks

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="tests/gpu: needs CUDA (nccl backend)"),
]

WORKER = REPO / "tests" / "integration" / "workers" / "engine_worker.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="a peer's death on NCCL needs 2 ranks on 2 GPUs (NCCL refuses two ranks on one device)",
)
@pytest.mark.parametrize("during", ["issued", "op", "step"])
def test_a_peer_killed_mid_operation_fails_the_survivor_on_nccl(during: str) -> None:
    port = _free_port()
    procs = start_two_ranks(WORKER, "kill", during, port=port)
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in outputs[0].splitlines() if "RESULT " in line]
    assert found, outputs[0]
    survivor = found[0]
    assert survivor["outcome"] == "HorovodInternalError", survivor
    assert survivor["later"] == "HorovodInternalError"
    assert survivor["seconds"] < 60, survivor


ABORT_SCRIPT = textwrap.dedent(
    """
    import torch
    import collectives as hvd
    from collectives import peer_loss, registry

    hvd.init(backend="nccl")
    t = torch.ones(1 << 20, device=hvd.device())
    hvd.allreduce_(t)
    torch.cuda.synchronize()
    peer_loss.abort_nccl(registry._registered[0])  # what the engine does once its rounds fail
    try:
        hvd.allreduce_(t)
        torch.cuda.synchronize()
        print("after abort: completed", flush=True)
    except Exception as error:
        print("after abort:", type(error).__name__, str(error)[:120], flush=True)
    hvd.shutdown()
    print("left", flush=True)
    """
)


def test_the_abort_ends_the_nccl_communicator_and_leaving_does_not_hang() -> None:
    env = {
        "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "PATH": "/usr/bin:/bin",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", ABORT_SCRIPT], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after abort: DistBackendError NCCL communicator was aborted" in done.stdout
    assert "left" in done.stdout
