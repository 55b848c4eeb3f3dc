"""Writes this rank's collectives topology as JSON to OUTDIR/rank{RANK}.json (launcher compatibility)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import collectives as hvd


def main() -> None:
    topology = hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
    record = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "backend": hvd.backend(),
        "rank_sum": float(total.item()),
        "master_addr": topology.master_addr,
    }
    Path(sys.argv[1], f"rank{hvd.rank()}.json").write_text(json.dumps(record))
    hvd.shutdown()


if __name__ == "__main__":
    main()
