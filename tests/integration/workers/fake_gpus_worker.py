"""Fakes what torch reports about GPUs, then calls collectives.init(): the backend choice of real ranks.

Usage (under distrun): fake_gpus_worker.py OUTDIR GPU_COUNT [BACKEND]. Writes OUTDIR/rank{RANK}.json; exits 3
with the error on stderr when init() refuses. Only gloo ever runs: nccl is either refused or not chosen.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import collectives as hvd


def main() -> int:
    outdir, count = Path(sys.argv[1]), int(sys.argv[2])
    requested = sys.argv[3] if len(sys.argv) > 3 else None
    # A host whose GPUs are all visible: what a rank sees there without CUDA_VISIBLE_DEVICES.
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: count
    dist.is_nccl_available = lambda: True
    try:
        hvd.init(requested)
    except hvd.CollectivesError as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    record = {"backend": hvd.backend(), "device": str(hvd.device()), "sum": total.item()}
    Path(outdir, f"rank{hvd.rank()}.json").write_text(json.dumps(record))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
