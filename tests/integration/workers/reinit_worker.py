"""Horovod's gloo-mode test pattern: ``init()``, collectives, ``barrier()``, ``shutdown()``, again and again.

Prints ``RESULT {...}`` with the rounds done. A rank that hangs (a re-initialisation that found the old store)
ends itself after ``REINIT_GUARD_S`` with its stack, so the test fails instead of hanging.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import torch

import collectives as hvd


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("REINIT_GUARD_S", "90")), exit=True)
    rounds = int(sys.argv[1])
    sums: list[float] = []
    for round_ in range(rounds):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        total = hvd.allreduce(torch.full((3,), float(rank + round_)), op=hvd.Sum, name=f"sum.{round_}")
        sums.append(float(total[0]))
        gathered = hvd.allgather(torch.tensor([rank]), name=f"ranks.{round_}")
        assert gathered.tolist() == list(range(size)), gathered
        hvd.barrier()
        hvd.shutdown()
        assert not hvd.is_initialized()
    print("RESULT " + json.dumps({"rank": int(os.environ["RANK"]), "sums": sums}), flush=True)


if __name__ == "__main__":
    main()
