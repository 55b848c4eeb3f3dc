"""Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py`` with its one import changed (``import
collectives as hvd``), a small stand-in net for torchvision's models, and ``--ddp`` for torch's DDP on the
same loop. Rank 0 prints one JSON line: {"img_s": total images per second, median of the iterations,
"rounds_per_step": the engine's agreement rounds per timed step on rank 0, where its engine counts them
(idle rounds included), "unagreed_per_step": the share of timed steps that went out with no agreement, where
the optimizer counts them}.

Run by ``benchmarks/synthetic.py`` under distrun, with whichever tree's ``collectives`` comes first on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import collectives as hvd


def stand_in(classes: int = 1000) -> nn.Module:
    """A small CNN (0.6 M parameters in 10 tensors) where Horovod's example builds ResNet-50."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, 2, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 16, 256),
        nn.ReLU(),
        nn.Linear(256, classes),
    )


def unagreed_steps(optimizer: Any) -> int | None:
    """The optimizer's steps that went out with no agreement, where it counts them (not an earlier tree's)."""
    agreement = getattr(optimizer, "_agreement", None)
    return None if agreement is None else int(agreement.steps_unagreed)


def rounds() -> int | None:
    """The agreement rounds this rank's engines have run, where they count them (not an earlier tree's)."""
    try:
        from collectives import engines  # a tree before the engine has none
    except ImportError:
        return None
    counts = [getattr(engine, "rounds", None) for engine in engines._engines.values()]
    if not counts or None in counts:
        return None
    return sum(c for c in counts if c is not None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--ddp", action="store_true", help="torch's DDP instead of DistributedOptimizer")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    model = stand_in()
    optimizer: torch.optim.Optimizer | hvd.DistributedOptimizer
    if args.ddp:
        net: nn.Module = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01 * hvd.size())
    else:
        net = model
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.none,
            op=hvd.Average,
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % 1000

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(net(data), target)
        loss.backward()
        optimizer.step()

    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rounds_before = rounds()
    unagreed_before = unagreed_steps(optimizer)
    img_secs = []
    for _ in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
    if dist.is_initialized():
        dist.barrier()
    out: dict[str, float] = {"img_s": hvd.size() * statistics.median(img_secs)}
    rounds_after = rounds()
    if rounds_before is not None and rounds_after is not None:
        out["rounds_per_step"] = (rounds_after - rounds_before) / (args.num_iters * args.num_batches_per_iter)
    if unagreed_before is not None:
        unagreed = (unagreed_steps(optimizer) or 0) - unagreed_before
        out["unagreed_per_step"] = unagreed / (args.num_iters * args.num_batches_per_iter)
    if hvd.rank() == 0:
        print(json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
