"""Training throughput: collectives.DistributedOptimizer vs torch DDP, and what their hooks cost per step.

    python benchmarks/bench_training.py                     # resnet18 and mlp, 2 ranks, through distrun
    python benchmarks/bench_training.py --image-size 32 --batch-size 8 --rounds 5   # small, for a CPU
    distrun -np 2 python benchmarks/bench_training.py --models digits   # one world size, as a distrun job

The models: ResNet-18 (11.7 M parameters, 1000 classes) on generated images, and a 10.2 M-parameter MLP
(5 linear layers) on generated vectors, large enough that gradient communication and its hooks matter
(``digits`` is the example's 0.15 M-parameter CNN). Three replicas start from the same weights and train on
the same batches: "local" (the plain optimizer, no hooks and no communication: the baseline),
DistributedOptimizer and DDP, both with the same buckets (their common default, a first bucket of 1 MB
and then 25 MB each, or both ``--bucket-cap-mb``). DDP runs with
``broadcast_buffers=False``: DistributedOptimizer does not synchronise buffers, so both do the same work,
and after the last round their parameters must agree (the table shows the largest difference). Each round
runs every method back to back, in rotating order; ratios and per-step overheads are medians over rounds
of the paired values, so machine noise, which changes slowly, affects both sides of a pair alike.

Run without a launcher, the script starts itself under distrun once per model and world size: on GPUs when
the machine has one per rank (nccl), else on the CPU with GPUs hidden (gloo), and prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from common import REPO, distrun, env_with_repo
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import collectives as hvd

METHODS = ("local", "DistributedOptimizer", "DDP")
MODELS = ("resnet18", "mlp", "digits")


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(inplace=True),
            nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet18(classes: int = 1000, small_images: bool = False) -> nn.Module:
    """ResNet-18 (He et al. 2016) as torchvision lays it out; `small_images`: a CIFAR-style 3x3 stem."""
    stem: list[nn.Module] = (
        [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
        if small_images
        else [
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        ]
    )
    layers: list[nn.Module] = []
    inputs = 64
    for index, width in enumerate((64, 128, 256, 512)):
        stride = 1 if index == 0 else 2
        layers += [BasicBlock(inputs, width, stride), BasicBlock(width, width, 1)]
        inputs = width
    return nn.Sequential(*stem, *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def mlp(features: int = 1024, hidden: int = 1536, classes: int = 1000) -> nn.Module:
    """10.2 M parameters in five linear layers: few, large gradients, so communication dominates."""
    layers: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, classes))


def make_model(name: str, image_size: int) -> tuple[nn.Module, tuple[int, ...], int]:
    """The model, one sample's shape and the number of classes."""
    if name == "mlp":
        return mlp(), (1024,), 1000
    if name == "digits":
        import importlib.util

        spec = importlib.util.spec_from_file_location("distrun_example", REPO / "examples" / "train.py")
        assert spec is not None and spec.loader is not None
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        return example.DigitsCNN(), (1, 8, 8), 10
    return resnet18(1000, small_images=image_size <= 64), (3, image_size, image_size), 1000


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
    """Seconds for the batches, between barriers (and, on a GPU, after the device has finished)."""
    hvd.barrier()
    started = time.perf_counter()
    for x, y in batches:
        step(x, y)
    if x.is_cuda:
        torch.cuda.synchronize()
    hvd.barrier()
    return time.perf_counter() - started


def worker(args: argparse.Namespace) -> int:
    hvd.init()
    device = hvd.device()
    _, shape, classes = make_model(args.model, args.image_size)
    gen = torch.Generator().manual_seed(hvd.rank())
    batches = [
        (
            torch.randn(args.batch_size, *shape, generator=gen).to(device),
            torch.randint(0, classes, (args.batch_size,), generator=gen).to(device),
        )
        for _ in range(args.steps)
    ]
    replicas = {}
    for name in METHODS:
        torch.manual_seed(0)
        replicas[name] = make_model(args.model, args.image_size)[0].to(device)
    sgd = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for name, m in replicas.items()}
    # Not given: each one's default (for DDP, unlike an explicit 25, that includes the small first bucket).
    buckets = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    ours = hvd.DistributedOptimizer(
        sgd["DistributedOptimizer"], replicas["DistributedOptimizer"].named_parameters(), **buckets
    )
    ddp = DistributedDataParallel(
        replicas["DDP"],
        device_ids=[device.index] if device.type == "cuda" else None,
        broadcast_buffers=False,
        **buckets,
    )
    steps = {
        "local": make_step(replicas["local"], sgd["local"]),
        "DistributedOptimizer": make_step(replicas["DistributedOptimizer"], ours),
        "DDP": make_step(ddp, sgd["DDP"]),
    }
    # Warm-up, three steps whatever --steps is: allocator, cuDNN autotuning, both bucket rebuilds.
    warm_up = [batches[i % len(batches)] for i in range(3)]
    for step in steps.values():
        time_steps(step, warm_up)
    seconds: dict[str, list[float]] = {name: [] for name in METHODS}
    for round_index in range(args.rounds):
        shift = round_index % len(METHODS)
        for name in METHODS[shift:] + METHODS[:shift]:
            seconds[name].append(time_steps(steps[name], batches))
    samples = args.batch_size * args.steps * hvd.size()
    # Same start, same batches, same number of steps: the two distributed replicas must agree.
    difference = max(
        float((a - b).abs().max())
        for a, b in zip(
            replicas["DistributedOptimizer"].parameters(), replicas["DDP"].parameters(), strict=True
        )
    )
    ratios = [a / b for a, b in zip(seconds["DDP"], seconds["DistributedOptimizer"], strict=True)]
    result = {
        "model": args.model,
        "ranks": hvd.size(),
        "backend": hvd.backend(),
        "device": device.type,
        "parameters": sum(p.numel() for p in replicas["local"].parameters()),
        "samples_per_s": {name: samples / statistics.median(s) for name, s in seconds.items()},
        "ratio": statistics.median(ratios),
        # The middle half of the per-round ratios: how far one round's pair is from the next, i.e. the noise.
        "quartiles": statistics.quantiles(ratios, n=4)[::2] if len(ratios) > 1 else [ratios[0]] * 2,
        "overhead_ms": {
            name: 1000
            * statistics.median(
                (a - b) / args.steps for a, b in zip(seconds[name], seconds["local"], strict=True)
            )
            for name in ("DistributedOptimizer", "DDP")
        },
        "rounds": {name: [round(samples / s, 1) for s in values] for name, values in seconds.items()},
        "difference": difference,
    }
    if hvd.is_coordinator():
        print_table(args, [result])
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(result))
    hvd.shutdown()
    return 0


def driver(args: argparse.Namespace) -> int:
    """Start the worker under distrun for each model and world size; print one table."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    worker_args = [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("image_size", "batch_size", "steps", "rounds", "bucket_cap_mb")
        if getattr(args, name) is not None
    ]
    rows = []
    for model in args.models:
        for size in args.world_sizes:
            env = env_with_repo()
            if gpus < size:
                env["CUDA_VISIBLE_DEVICES"] = ""  # one rank per GPU or none: gloo on the CPU
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp, "result.json")
                command = distrun(
                    "-np", size, sys.executable, __file__, *worker_args, f"--models={model}", "--json", out
                )
                subprocess.run(command, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
                rows.append(json.loads(out.read_text()))
    print_table(args, rows)
    return 0


def print_table(args: argparse.Namespace, rows: Sequence[dict[str, Any]]) -> None:
    print(
        f"batch {args.batch_size} per rank, {args.image_size}x{args.image_size} images for resnet18, "
        + (
            f"bucket cap {args.bucket_cap_mb} MB for both"
            if args.bucket_cap_mb
            else "buckets of 1 MB then 25 MB for both (their default)"
        )
        + f", {args.steps} steps x {args.rounds} rounds"
    )
    print(
        "| model | ranks | device, backend | local samples/s | DistributedOptimizer | DDP "
        "| DistributedOptimizer / DDP | overhead per step: DistributedOptimizer | DDP | max param diff |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        rate, over = row["samples_per_s"], row["overhead_ms"]
        print(
            f"| {row['model']} ({row['parameters'] / 1e6:.1f} M) | {row['ranks']} "
            f"| {row['device']}, {row['backend']} | {rate['local']:.1f} "
            f"| {rate['DistributedOptimizer']:.1f} | {rate['DDP']:.1f} "
            f"| {row['ratio']:.3f} ({row['quartiles'][0]:.2f}-{row['quartiles'][1]:.2f}) "
            f"| {over['DistributedOptimizer']:+.1f} ms | {over['DDP']:+.1f} ms | {row['difference']:.1e} |"
        )
    print(
        "ratio: samples/s of DistributedOptimizer over DDP (> 1: faster), median of the per-round "
        "paired ratios (their quartiles); overhead: step time over the local optimizer's (hooks, "
        "communication and waiting), median of per-round paired differences"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models",
        type=lambda value: [name for name in value.split(",") if name],
        default=["resnet18", "mlp"],
        help=f"comma-separated, of {', '.join(MODELS)} (default resnet18,mlp)",
    )
    parser.add_argument(
        "--image-size", type=int, default=224, help="resnet18 input (<= 64: CIFAR-style stem)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed run (1: finest interleaving)")
    parser.add_argument("--rounds", type=int, default=11, help="rounds of one run per method")
    parser.add_argument(
        "--world-sizes",
        type=lambda value: [int(n) for n in value.split(",")],
        default=[2],
        help="without a launcher: the world sizes to run (default 2)",
    )
    parser.add_argument(
        "--bucket-cap-mb", type=float, help="for both (default: their default, 1 MB first, then 25 MB)"
    )
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if "RANK" not in os.environ:
        return driver(args)
    if len(args.models) != 1:
        raise SystemExit("as a distrun job, give one model: --models NAME")
    args.model = args.models[0]
    return worker(args)


if __name__ == "__main__":
    raise SystemExit(main())
