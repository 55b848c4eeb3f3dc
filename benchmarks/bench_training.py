"""Training throughput: collectives.DistributedOptimizer vs torch DDP on the example's DigitsCNN.

    distrun -np 2 python benchmarks/bench_training.py

Both replicas start from the same weights and train on the same random batches. Each round runs both
methods back to back (alternating which goes first); the reported ratio is the median over rounds of the
two runs' samples/s ratio, so machine noise, which changes slowly, affects both sides of a pair alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import collectives as hvd

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("distrun_example_train", EXAMPLE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_step(
    model: nn.Module, optimizer: torch.optim.Optimizer | hvd.DistributedOptimizer
) -> Callable[..., None]:
    loss_fn = nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    return step


def time_steps(step: Callable[..., None], batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Samples per second of all ranks together, timed between barriers."""
    hvd.barrier()
    started = time.perf_counter()
    for x, y in batches:
        step(x, y)
    hvd.barrier()
    elapsed = time.perf_counter() - started
    return sum(len(y) for _, y in batches) * hvd.size() / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=32, help="per rank, as in the example")
    parser.add_argument("--steps", type=int, default=15, help="steps per timed run")
    parser.add_argument("--rounds", type=int, default=41, help="rounds of one run per method")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)

    hvd.init()
    device = hvd.device()
    example = load_example()
    images, labels, _ = example.load_data()
    gen = torch.Generator().manual_seed(hvd.rank())
    batches = []
    for _ in range(args.steps):
        index = torch.randint(0, len(labels), (args.batch_size,), generator=gen)
        batches.append((images[index].to(device), labels[index].to(device)))

    torch.manual_seed(0)
    ours = example.DigitsCNN().to(device)
    theirs = example.DigitsCNN().to(device)
    theirs.load_state_dict(ours.state_dict())
    hvd_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9), ours.named_parameters()
    )
    ddp = DistributedDataParallel(theirs, device_ids=[device.index] if device.type == "cuda" else None)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    methods = {"DistributedOptimizer": make_step(ours, hvd_opt), "DDP": make_step(ddp, ddp_opt)}

    for step in methods.values():  # warm-up: allocator, DDP's bucket rebuild on its first iterations
        time_steps(step, batches[:5])
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for round_index in range(args.rounds):
        order = list(methods) if round_index % 2 == 0 else list(reversed(methods))
        for name in order:
            rates[name].append(time_steps(methods[name], batches))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    # Paired: the two runs of one round are adjacent in time and see the same machine load.
    ratio = statistics.median(a / b for a, b in zip(rates["DistributedOptimizer"], rates["DDP"], strict=True))
    if hvd.is_coordinator():
        print(
            f"DigitsCNN, {hvd.size()} ranks, backend {hvd.backend()}, batch {args.batch_size}/rank, "
            f"{args.steps} steps x {args.rounds} interleaved rounds"
        )
        for name, value in medians.items():
            spread = ", ".join(f"{v:.0f}" for v in rates[name])
            print(f"{name:>22}: median {value:8.0f} samples/s   (rounds: {spread})")
        print(f"DistributedOptimizer / DDP samples/s: {ratio:.3f} (median of per-round ratios)")
        if args.json_path:
            Path(args.json_path).write_text(
                json.dumps({"ranks": hvd.size(), "medians": medians, "ratio": ratio})
            )
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
