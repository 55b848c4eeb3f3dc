"""One rank of the collectives correctness job: runs every scenario and saves raw results for the test.

Usage (under distrun): collectives_worker.py OUTDIR. Each rank writes OUTDIR/rank{RANK}.pt; the single-process
references are computed here too, in plain torch without any collective, from the same seeded data.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import collectives as hvd

BATCH = 4  # samples per rank per step


def make_model(seed: int, batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 16),
    ]
    if batchnorm:
        layers.append(nn.BatchNorm1d(16))
    layers += [nn.Tanh(), nn.Linear(16, 5)]
    return nn.Sequential(*layers)


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, 1, 6, 6, generator=gen), torch.randint(0, 5, (samples,), generator=gen)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def shard(t: torch.Tensor, rank: int, block: int) -> torch.Tensor:
    return t[rank * block : (rank + 1) * block]


def scenario_gradients(rank: int, size: int, compression: hvd.Compressor) -> dict[str, Any]:
    x, y = make_data(size * BATCH, seed=1)
    model = make_model(0)
    # A tiny bucket cap forces several buckets, so the in-order launch across buckets is exercised.
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model.named_parameters(),
        compression=compression,
        bucket_cap_mb=0.0005,
    )
    loss_fn(model, shard(x, rank, BATCH), shard(y, rank, BATCH)).backward()
    opt.synchronize()
    reference = make_model(0)
    loss_fn(reference, x, y).backward()
    return {"dist": grads_of(model), "ref": grads_of(reference)}


def scenario_training(rank: int, size: int, steps: int = 5) -> dict[str, Any]:
    model, reference = make_model(0), make_model(0)

    def sgd(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    opt = hvd.DistributedOptimizer(sgd(model), model.named_parameters())
    ref_opt = sgd(reference)
    for step in range(steps):
        x, y = make_data(size * BATCH, seed=100 + step)
        opt.zero_grad()
        loss_fn(model, shard(x, rank, BATCH), shard(y, rank, BATCH)).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(reference, x, y).backward()
        ref_opt.step()
    return {"dist": params_of(model), "ref": params_of(reference)}


def scenario_accumulation(rank: int, size: int, passes: int = 4) -> dict[str, Any]:
    x, y = make_data(passes * size * BATCH, seed=7)
    model, reference = make_model(0), make_model(0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(), backward_passes_per_step=passes
    )
    for micro in range(passes):
        block = micro * size + rank
        loss_fn(model, shard(x, block, BATCH), shard(y, block, BATCH)).backward()
    opt.step()
    too_many = False
    opt.zero_grad()
    for _ in range(passes):
        loss_fn(model, x[:BATCH], y[:BATCH]).backward()
    try:
        loss_fn(model, x[:BATCH], y[:BATCH]).backward()
    except hvd.GradientSyncError:
        too_many = True
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    loss_fn(reference, x, y).backward()
    ref_opt.step()
    return {"dist": params_of(model), "ref": params_of(reference), "too_many_raised": too_many}


def scenario_broadcast_state(rank: int, size: int) -> dict[str, Any]:
    model = make_model(100 + rank, batchnorm=True)
    x, y = make_data(BATCH, seed=200 + rank)
    model.train()
    loss_fn(model, x, y).backward()  # diverges the BatchNorm running stats too
    adam = torch.optim.Adam(model.parameters(), lr=1e-3 * (rank + 1))
    adam.step()
    before = params_of(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    moments = [adam.state[p]["exp_avg"].clone() for p in model.parameters()]
    return {
        "before": before,
        "after": params_of(model),
        "moments": moments,
        "lr": adam.param_groups[0]["lr"],
    }


def scenario_ops(rank: int, size: int, outdir: Path) -> dict[str, Any]:
    base = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
    out: dict[str, Any] = {
        op.name: hvd.allreduce(base, op=op) for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product)
    }
    out["input_unchanged"] = torch.equal(base, torch.tensor([rank + 1.0, 2.0 * (rank + 1)]))
    out["async"] = hvd.allreduce_async(base, op=hvd.Sum).wait()
    inplace = base.clone()
    hvd.allreduce_(inplace)
    out["inplace"] = inplace
    out["grouped"] = hvd.grouped_allreduce(
        [torch.full((3,), float(rank)), torch.full((2, 2), float(rank), dtype=torch.float64)]
    )
    out["grouped_sum_int"] = hvd.grouped_allreduce(
        [torch.full((4,), rank, dtype=torch.int64), torch.full((2,), float(rank))], op=hvd.Sum
    )
    out["allgather_uneven"] = hvd.allgather(torch.full((rank + 1, 3), float(rank)))
    out["allgather_even"] = hvd.allgather(torch.full((2,), float(rank)))
    out["broadcast"] = hvd.broadcast(torch.full((3,), float(rank)), root_rank=size - 1)
    out["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=size - 1)
    send = torch.cat([torch.full((j + 1, 2), 100.0 * rank + j) for j in range(size)])
    out["alltoall"] = hvd.alltoall(send, splits=[j + 1 for j in range(size)])
    out["alltoall_even"] = hvd.alltoall(torch.arange(size * 2.0) + 10 * rank)
    out["reduce_scatter_even"] = hvd.reduce_scatter(
        torch.arange(size * 2.0 * 2).view(size * 2, 2) * (rank + 1)
    )
    out["reduce_scatter_uneven"] = hvd.reduce_scatter(torch.arange(size * 2.0 + 1) * (rank + 1), op=hvd.Sum)
    out["metrics"] = hvd.average_metrics({"loss": float(rank), "acc": torch.tensor(2.0 * rank)})
    try:
        hvd.average_metrics({"a" if rank == 0 else "b": 1.0})
        out["metric_mismatch_raised"] = False
    except hvd.MetricKeysMismatchError:
        out["metric_mismatch_raised"] = True
    try:
        hvd.allreduce(torch.ones(2, dtype=torch.int64))
        out["int_average_raised"] = False
    except hvd.CollectivesError:
        out["int_average_raised"] = True
    written = hvd.save_checkpoint({"w": torch.arange(3.0), "epoch": 3}, outdir / "ckpt" / "model.pt")
    out["ckpt_written"] = None if written is None else str(written)
    out["ckpt_loaded"] = hvd.load_checkpoint(outdir / "ckpt" / "model.pt")
    out["ckpt_missing"] = hvd.load_checkpoint(outdir / "ckpt" / "absent.pt")
    out["topology"] = (
        hvd.rank(),
        hvd.size(),
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
    )
    out["is_coordinator"] = hvd.is_coordinator()
    return out


def scenario_sharding(rank: int, size: int) -> dict[str, Any]:
    sampler = hvd.ShardSampler(103, seed=5)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append({"indices": list(sampler), "batches": sampler.batches(10), "len": len(sampler)})
    return {"epochs": epochs}


def scenario_zero_grad_guard(rank: int, size: int) -> bool:
    model = make_model(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    x, y = make_data(BATCH, seed=3)
    loss_fn(model, x, y).backward()
    try:
        opt.zero_grad()
        raised = False
    except hvd.GradientSyncError:
        raised = True
    opt.step()  # completes the in-flight allreduces so every rank stays in step
    opt.remove_hooks()
    return raised


def main() -> None:
    outdir = Path(sys.argv[1])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {
        "gradients": scenario_gradients(rank, size, hvd.Compression.none),
        "gradients_fp16": scenario_gradients(rank, size, hvd.Compression.fp16),
        "gradients_bf16": scenario_gradients(rank, size, hvd.Compression.bf16),
        "training": scenario_training(rank, size),
        "accumulation": scenario_accumulation(rank, size),
        "broadcast_state": scenario_broadcast_state(rank, size),
        "ops": scenario_ops(rank, size, outdir),
        "sharding": scenario_sharding(rank, size),
        "zero_grad_guard": scenario_zero_grad_guard(rank, size),
    }
    torch.save(results, outdir / f"rank{rank}.pt")
    hvd.shutdown()


if __name__ == "__main__":
    main()
