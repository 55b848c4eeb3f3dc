"""Ranks that keep the engine busy on each of its small-data paths, pass after pass until Ctrl-C: a burst of
64 named async 1 KB allreduces (agreed by the response cache's bits after the first pass, fused and
gathered), a grouped allreduce of 64 x 1 KB and a blocking allreduce of 64 KB (both riding in their round
once the round's buffer has grown). Every result is checked against its exact sum; a wrong one raises.

busy_engine.py DIR: DIR/rank.N.passes holds the count of passes done, DIR/rank.N.pid the rank's pid once three
passes are done and an allreduce has ridden its round; on Ctrl-C, "rank N stopped after K passes, every sum
right"."""

import os
import sys
from pathlib import Path

import torch

import collectives as hvd
from collectives import engines

out = Path(sys.argv[1])
hvd.init()
rank, size = hvd.rank(), hvd.size()
want = float(sum(range(1, size + 1)))


def one_pass(step: int) -> None:
    burst = [torch.full((256,), rank + 1.0) for _ in range(64)]
    handles = [hvd.allreduce_async_(t, name=f"burst.{i}", op=hvd.Sum) for i, t in enumerate(burst)]
    for handle in handles:
        hvd.synchronize(handle)
    grouped = [torch.full((256,), rank + 1.0) for _ in range(64)]
    hvd.grouped_allreduce_(grouped, op=hvd.Sum)
    big = torch.full((16384,), rank + 1.0)
    hvd.allreduce_(big, op=hvd.Sum)
    for what, tensors in (("burst", burst), ("grouped", grouped), ("64 KB", [big])):
        for t in tensors:
            if not bool((t == want).all()):
                raise AssertionError(f"pass {step}: {what} summed to {t.unique().tolist()}, not {want}")


passes = 0
try:
    while True:
        one_pass(passes)
        passes += 1
        (out / f"rank.{rank}.part").write_text(str(passes))
        os.replace(out / f"rank.{rank}.part", out / f"rank.{rank}.passes")
        if passes == 3:
            if engines._engines[0].reduced_in_round == 0:
                raise AssertionError("no allreduce rode in its round in three passes")
            (out / f"rank.{rank}.pid").write_text(str(os.getpid()))
except KeyboardInterrupt:
    print(f"rank {rank} stopped after {passes} passes, every sum right", flush=True)
