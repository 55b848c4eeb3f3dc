"""collectives.elastic's NCCL path: after a failure the communicator is aborted and the group re-formed in
the same process (collectives.context.reinit), and collectives work again on the GPU. One GPU is enough:
a 1-rank NCCL group is aborted (what the agent's peer_lost does) and re-joined at a new address; the
peer-death case needs two GPUs."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="tests/gpu: needs CUDA (nccl backend)"),
]

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    import collectives as hvd
    from collectives import context
    from collectives.elastic.run import _abort_on_peer_lost
    from collectives.errors import HorovodInternalError

    hvd.init(backend="nccl")
    t = torch.ones(4, device=hvd.device())
    hvd.allreduce_(t)
    _abort_on_peer_lost()  # the agent said a peer is gone: the communicator is aborted
    try:
        hvd.allreduce_(t)
        raise SystemExit("a collective on an aborted communicator returned")
    except Exception as error:  # what NCCL raises after an abort
        print("after abort:", type(error).__name__, flush=True)
    os.environ["MASTER_PORT"] = sys.argv[1]
    topology = context.reinit(os.environ)
    t = torch.full((4,), 2.0, device=hvd.device())
    hvd.allreduce_(t)
    assert t.tolist() == [2.0] * 4, t
    print("re-formed", topology.size, hvd.backend(), flush=True)
    hvd.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_aborted_nccl_group_is_re_formed_in_the_same_process() -> None:
    env = {
        "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "PATH": "/usr/bin:/bin",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(_free_port())], env=env, capture_output=True, timeout=300
    )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "re-formed 1 nccl" in out
