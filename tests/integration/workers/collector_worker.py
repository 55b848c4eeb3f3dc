"""One rank of tests/integration/test_collector.py: what ``init()`` left to the garbage collector, and how
many tracked objects a burst of named async allreduces keeps alive per operation; prints one JSON line."""

from __future__ import annotations

import gc
import json

import torch

import collectives as hvd
from collectives import engines
from collectives.reduce_op import ReduceOp

COUNT = 200


def burst(tensors: list[torch.Tensor]) -> list[hvd.Handle[torch.Tensor]]:
    return [hvd.allreduce_async_(t, name=f"collector.{i}", op=ReduceOp.SUM) for i, t in enumerate(tensors)]


def main() -> None:
    hvd.init()
    frozen = gc.get_freeze_count()
    tensors = [torch.ones(4) for _ in range(COUNT)]
    for handle in burst(tensors):  # the first burst plans, caches and agrees every name
        hvd.synchronize(handle)
    hvd.barrier()
    # The round lock held through the submissions, as a caller's long round holds it: on a loaded machine the
    # engine thread's cycle may end mid-burst, and the objects of that round would count too.
    with engines._engines[0]._round_lock._lock:
        gc.disable()  # the count of young objects then only grows with what is allocated and kept
        before = gc.get_count()[0]
        handles = burst(tensors)
        kept = (gc.get_count()[0] - before) / COUNT
    values = [hvd.synchronize(h)[0].item() for h in handles]
    gc.enable()
    result = {"rank": hvd.rank(), "frozen": frozen, "tracked_per_op": kept, "values": sorted(set(values))}
    print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
