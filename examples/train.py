"""Data-parallel training of a small CNN on scikit-learn's 8x8 digits, the Horovod way, with collectives.

    python examples/train.py                 # one process
    distrun -np 4 examples/train.py          # four ranks, same accuracy, ~4x the samples per step

The steps of seed article 004: init, shuffle-then-shard the data, scale the learning rate by the number of
ranks (with warm-up), wrap the optimizer, broadcast the initial state from rank 0, average the metrics, and
write checkpoints from rank 0 only. Without scikit-learn it falls back to generated 8x8 digit-like images.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

import collectives as hvd

NUM_CLASSES = 10


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions and two dense layers for 1x8x8 images (about 150k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, NUM_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


def synthetic_digits(samples: int = 1797, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Digit-like data needing no download: ten random 8x8 prototypes plus noise and random shifts."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = (torch.rand(NUM_CLASSES, 8, 8, generator=gen) > 0.6).float()
    labels = torch.arange(samples) % NUM_CLASSES
    images = prototypes[labels] + 0.35 * torch.randn(samples, 8, 8, generator=gen)
    shifts = torch.randint(-1, 2, (samples,), generator=gen)
    images = torch.stack([torch.roll(img, int(s), dims=1) for img, s in zip(images, shifts, strict=True)])
    return images.unsqueeze(1), labels


def load_data(source: str = "auto") -> tuple[torch.Tensor, torch.Tensor, str]:
    """(images N x 1 x 8 x 8 in [0, 1], labels, name of the source actually used)."""
    if source in ("auto", "digits"):
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            if source == "digits":
                raise
        else:
            digits = load_digits()
            images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
            return images, torch.tensor(digits.target, dtype=torch.int64), "sklearn digits"
    images, labels = synthetic_digits()
    return images, labels, "synthetic digits"


def train_test_split(
    images: torch.Tensor, labels: torch.Tensor, test_fraction: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed split, identical on every rank (the permutation's seed does not depend on the rank)."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    cut = int(len(labels) * (1 - test_fraction))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device) -> float:
    """Accuracy over the whole test set: each rank scores its shard, the counts are summed."""
    sampler = hvd.ShardSampler(len(labels), shuffle=False)
    index = torch.tensor(sampler.indices(), dtype=torch.int64)
    model.eval()
    with torch.no_grad():
        logits = model(images[index].to(device))
    model.train()
    correct = float((logits.argmax(1).cpu() == labels[index]).sum())
    totals = hvd.reduce_metrics({"correct": correct, "count": float(len(index))}, op=hvd.Sum)
    return totals["correct"] / totals["count"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.02, help="single-process learning rate")
    parser.add_argument("--lr-scaling", choices=["linear", "sqrt", "none"], default="linear")
    parser.add_argument("--warmup-epochs", type=float, default=3.0)
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    parser.add_argument("--data", choices=["auto", "digits", "synthetic"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint", default="checkpoints/digits_cnn.pt", help="written by rank 0 each epoch"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from --checkpoint if it exists (always, when restarted by distrun or torchrun)",
    )
    parser.add_argument("--json-out", help="rank 0 writes the final metrics here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    hvd.init()
    device = hvd.device()
    images, labels, source = load_data(args.data)
    train_x, train_y, test_x, test_y = train_test_split(images, labels)

    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: broadcast_parameters must fix it
    model = DigitsCNN().to(device)
    sampler = hvd.ShardSampler(len(train_y), seed=args.seed)
    steps_per_epoch = sampler.num_batches(args.batch_size)
    schedule = hvd.WarmupSchedule.for_size(
        args.lr, hvd.size(), args.warmup_epochs, steps_per_epoch, rule=args.lr_scaling
    )
    base_optimizer = torch.optim.SGD(model.parameters(), lr=schedule.target_lr, momentum=0.9)
    lr_scheduler = schedule.scheduler(base_optimizer)
    optimizer = hvd.DistributedOptimizer(
        base_optimizer, model.named_parameters(), compression=getattr(hvd.Compression, args.compression)
    )

    start_epoch = 0
    # A restarted job (distrun or torchrun --max-restarts) picks up where the last attempt stopped.
    if args.resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        state = hvd.load_checkpoint(args.checkpoint)
        if state is not None:
            model.load_state_dict(state["model"])
            base_optimizer.load_state_dict(state["optimizer"])
            lr_scheduler.load_state_dict(state["scheduler"])
            start_epoch = int(state["epoch"]) + 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if hvd.is_coordinator():
        print(
            f"{source}: {len(train_y)} train / {len(test_y)} test, {hvd.size()} rank(s), "
            f"batch {args.batch_size}/rank ({args.batch_size * hvd.size()} global), "
            f"lr {args.lr} -> {schedule.target_lr:g} ({args.lr_scaling}, warm-up {args.warmup_epochs} epochs)"
        )
    loss_fn = nn.CrossEntropyLoss()
    summary: dict[str, float] = {"start_epoch": float(start_epoch)}
    rates: list[float] = []
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        loss_sum = correct = seen = 0.0
        hvd.barrier()
        started = time.perf_counter()
        for batch in sampler.batches(args.batch_size):
            index = torch.tensor(batch, dtype=torch.int64)
            x, y = train_x[index].to(device), train_y[index].to(device)
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            loss_sum += loss.item() * len(batch)
            correct += float((logits.argmax(1) == y).sum())
            seen += len(batch)
        hvd.barrier()
        elapsed = time.perf_counter() - started
        totals = hvd.reduce_metrics({"loss": loss_sum, "correct": correct, "seen": seen}, op=hvd.Sum)
        rate = totals["seen"] / elapsed
        if epoch > start_epoch:  # the first epoch pays for warm-up allocations and thread start
            rates.append(rate)
        test_accuracy = evaluate(model, test_x, test_y, device)
        summary = {
            "start_epoch": float(start_epoch),
            "epoch": float(epoch),
            "train_loss": totals["loss"] / totals["seen"],
            "train_accuracy": totals["correct"] / totals["seen"],
            "test_accuracy": test_accuracy,
            "samples_per_s": rate,
            "lr": base_optimizer.param_groups[0]["lr"],
        }
        hvd.save_checkpoint(
            {
                "model": model.state_dict(),
                "optimizer": base_optimizer.state_dict(),
                "scheduler": lr_scheduler.state_dict(),
                "epoch": epoch,
            },
            args.checkpoint,
        )
        if hvd.is_coordinator():
            print(
                f"epoch {epoch + 1:3d}/{args.epochs}  loss {summary['train_loss']:.4f}  "
                f"train acc {summary['train_accuracy']:.4f}  test acc {test_accuracy:.4f}  "
                f"lr {summary['lr']:.4g}  {rate:8.0f} samples/s"
            )
    if rates:
        summary["mean_samples_per_s"] = sum(rates) / len(rates)
    if hvd.is_coordinator():
        final = summary.get("test_accuracy", float("nan"))
        print(f"final test accuracy {final:.4f}; checkpoint {args.checkpoint}")
        if args.json_out:
            Path(args.json_out).write_text(
                json.dumps({"ranks": hvd.size(), "source": source, **summary}, indent=2)
            )
    hvd.shutdown()
    return summary


if __name__ == "__main__":
    main()
