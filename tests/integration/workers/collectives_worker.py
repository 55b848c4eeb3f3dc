"""One rank of the collectives correctness job: runs every scenario and saves raw results for the test.

Usage (under distrun): collectives_worker.py OUTDIR. Each rank writes OUTDIR/rank{RANK}.pt (CPU tensors); the
single-process references are computed here too, in plain torch without any collective, from the same seeded
data. Everything runs on hvd.device(), so the same worker checks nccl on GPUs (tests/gpu/test_nccl.py).

The worker creates the default process group itself and lets collectives.init() adopt it, with an empty
environment: that exercises the adoption path (host-name placement, the RANK consistency check).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import collectives as hvd

BATCH = 4  # samples per rank per step
DEVICE = torch.device("cpu")  # set to hvd.device() by main()


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
    return nn.Sequential(*layers).to(DEVICE)


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(samples, 1, 6, 6, generator=gen), torch.randint(0, 5, (samples,), generator=gen)
    return x.to(DEVICE), y.to(DEVICE)


def full(shape: int | tuple[int, ...], value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full(shape if isinstance(shape, tuple) else (shape,), value, dtype=dtype, device=DEVICE)


def to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return value


def raises(error: type[BaseException], fn: Any, *args: Any) -> bool:
    try:
        fn(*args)
    except error:
        return True
    return False


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def shard(t: torch.Tensor, rank: int, block: int) -> torch.Tensor:
    return t[rank * block : (rank + 1) * block]


def train_side_by_side(
    model: nn.Module,
    opt: Any,
    reference: nn.Module,
    ref_opt: torch.optim.Optimizer,
    steps: int,
    *,
    seed: int,
    rank: int,
    size: int,
) -> None:
    """Each step: this rank trains on its shard of the batch, the reference on the whole (combined) batch."""
    for step in range(steps):
        x, y = make_data(size * BATCH, seed=seed + step)
        opt.zero_grad()
        loss_fn(model, shard(x, rank, BATCH), shard(y, rank, BATCH)).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(reference, x, y).backward()
        ref_opt.step()


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
    train_side_by_side(model, opt, reference, ref_opt, steps, seed=100, rank=rank, size=size)
    return {"dist": params_of(model), "ref": params_of(reference)}


def horovod_accumulation(
    reference: nn.Module, x: torch.Tensor, y: torch.Tensor, size: int, passes: int
) -> None:
    """Horovod's gradient for backward_passes_per_step: each rank's micro-batch gradients summed over the
    passes, then averaged over the ranks (op=Average divides by the ranks alone)."""
    for micro in range(passes):
        for r in range(size):
            (
                loss_fn(reference, shard(x, micro * size + r, BATCH), shard(y, micro * size + r, BATCH))
                / size
            ).backward()


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
    # The k passes before the refused one launched allreduces on every rank: wait for them, then unhook, so
    # that nothing of this scenario is left in flight when the next one starts its collectives.
    opt.synchronize()
    opt.remove_hooks()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    horovod_accumulation(reference, x, y, size, passes)
    ref_opt.step()
    return {"dist": params_of(model), "ref": params_of(reference), "too_many_raised": too_many}


def scenario_accumulation_early_step(rank: int, size: int, passes: int = 3) -> dict[str, Any]:
    """Horovod's counters: step() after 2 of 3 passes reduces what has accumulated, and the count starts
    again, so the next 3 passes make one full step (a 4th would raise)."""
    x, y = make_data(2 * passes * size * BATCH, seed=17)
    first, second = x[: passes * size * BATCH], x[passes * size * BATCH :]
    first_y, second_y = y[: passes * size * BATCH], y[passes * size * BATCH :]
    model, reference = make_model(0), make_model(0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.2), model.named_parameters(), backward_passes_per_step=passes
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.2)
    for data, labels, done in ((first, first_y, passes - 1), (second, second_y, passes)):
        opt.zero_grad()
        for micro in range(done):
            block = micro * size + rank
            loss_fn(model, shard(data, block, BATCH), shard(labels, block, BATCH)).backward()
        opt.step()
        ref_opt.zero_grad()
        horovod_accumulation(reference, data, labels, size, done)
        ref_opt.step()
    opt.remove_hooks()
    return {"dist": params_of(model), "ref": params_of(reference)}


def scenario_sum_op(rank: int, size: int) -> dict[str, Any]:
    """op=Sum, with synchronize() and then a plain step(): the gradients must be summed once, not twice."""
    x, y = make_data(size * BATCH, seed=11)
    model = make_model(0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=hvd.Sum
    )
    loss_fn(model, shard(x, rank, BATCH), shard(y, rank, BATCH)).backward()
    opt.synchronize()
    opt.step()
    dist_grads = grads_of(model)
    reference = make_model(0)
    for r in range(size):  # accumulates: the sum of every rank's gradient
        loss_fn(reference, shard(x, r, BATCH), shard(y, r, BATCH)).backward()
    return {"dist": dist_grads, "ref": grads_of(reference)}


def scenario_compressed_accumulation(rank: int, size: int, passes: int = 2) -> dict[str, Any]:
    """fp16 compression with backward_passes_per_step=2, synchronize() then step(): averaged exactly once."""
    x, y = make_data(passes * size * BATCH, seed=13)
    model = make_model(0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model.named_parameters(),
        compression=hvd.Compression.fp16,
        backward_passes_per_step=passes,
    )
    for micro in range(passes):
        block = micro * size + rank
        loss_fn(model, shard(x, block, BATCH), shard(y, block, BATCH)).backward()
    opt.synchronize()
    opt.step()
    dist_grads = grads_of(model)
    reference = make_model(0)
    horovod_accumulation(reference, x, y, size, passes)
    return {"dist": dist_grads, "ref": grads_of(reference)}


def scenario_different_parameters(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 uses a then c; the others b, a, c: other autograd orders, and b unused on rank 0."""

    def build() -> tuple[list[tuple[str, nn.Parameter]], nn.Module, nn.Module, nn.Module]:
        torch.manual_seed(0)
        a, b, c = nn.Linear(3, 3).to(DEVICE), nn.Linear(3, 3).to(DEVICE), nn.Linear(3, 1).to(DEVICE)
        named = [
            *a.named_parameters(prefix="a"),
            *b.named_parameters(prefix="b"),
            *c.named_parameters(prefix="c"),
        ]
        return named, a, b, c

    def local_loss(r: int, a: nn.Module, b: nn.Module, c: nn.Module) -> torch.Tensor:
        x = full((2, 3), r + 1.0)
        loss: torch.Tensor = c(a(x) if r == 0 else a(b(x))).sum()
        return loss

    named, a, b, c = build()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named, bucket_cap_mb=1e-5)
    local_loss(rank, a, b, c).backward()
    opt.step()
    dist_grads = [p.grad.detach().clone() if p.grad is not None else None for _, p in named]
    expected = [torch.zeros_like(p) for _, p in named]
    for r in range(size):
        ref_named, ra, rb, rc = build()
        local_loss(r, ra, rb, rc).backward()
        for total, (_, p) in zip(expected, ref_named, strict=True):
            if p.grad is not None:
                total.add_(p.grad / size)
    return {"dist": dist_grads, "ref": expected}


def scenario_ddp(rank: int, size: int, compression: hvd.Compressor, steps: int = 5) -> dict[str, Any]:
    """DistributedOptimizer and DDP with the same (small, so several) buckets train two copies side by side.

    With compression, DDP gets torch's fp16_compress_hook, which divides, casts and sums as ours does.
    """
    model, twin = make_model(0), make_model(0)
    cap_mb = 0.002

    def sgd(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    opt = hvd.DistributedOptimizer(
        sgd(model), model.named_parameters(), compression=compression, bucket_cap_mb=cap_mb
    )
    ddp = DistributedDataParallel(
        twin, device_ids=[DEVICE.index] if DEVICE.type == "cuda" else None, bucket_cap_mb=cap_mb
    )
    if compression is hvd.Compression.fp16:
        ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    ddp_opt = sgd(twin)
    for step in range(steps):
        x, y = make_data(size * BATCH, seed=400 + step)
        opt.zero_grad()
        loss_fn(model, shard(x, rank, BATCH), shard(y, rank, BATCH)).backward()
        opt.step()
        ddp_opt.zero_grad()
        loss_fn(ddp, shard(x, rank, BATCH), shard(y, rank, BATCH)).backward()
        ddp_opt.step()
    opt.remove_hooks()
    return {"dist": params_of(model), "ddp": params_of(twin)}


def scenario_unused(rank: int, size: int, passes: int = 2, steps: int = 2) -> dict[str, Any]:
    """Parameters without a gradient: `idle` on every rank; `b` on rank 0 in the second of two passes only.

    The bucket cap puts every parameter in its own bucket, so a bucket whose gradient never comes sits
    between buckets that fill during backward: those must not wait for it, nor the job hang.
    """

    def build() -> tuple[list[tuple[str, nn.Parameter]], dict[str, nn.Module]]:
        torch.manual_seed(0)
        layers = {
            "a": nn.Linear(3, 3).to(DEVICE),
            "b": nn.Linear(3, 3).to(DEVICE),
            "idle": nn.Linear(3, 3).to(DEVICE),
            "c": nn.Linear(3, 1).to(DEVICE),
        }
        named = [item for prefix, layer in layers.items() for item in layer.named_parameters(prefix=prefix)]
        return named, layers

    def local_loss(r: int, micro: int, step: int, layers: dict[str, nn.Module]) -> torch.Tensor:
        x = full((2, 3), r + 1.0 + micro + 10 * step)
        hidden = layers["a"](x) if r == 0 and micro == 0 else layers["a"](layers["b"](x))
        loss: torch.Tensor = layers["c"](torch.tanh(hidden)).sum()
        return loss

    named, layers = build()
    sgd = torch.optim.SGD([p for _, p in named], lr=0.1)
    opt = hvd.DistributedOptimizer(sgd, named, backward_passes_per_step=passes, bucket_cap_mb=1e-5)
    ref_named, ref_layers = build()
    ref_opt = torch.optim.SGD([p for _, p in ref_named], lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(passes):
            local_loss(rank, micro, step, layers).backward()
        opt.step()
        ref_opt.zero_grad()
        for r in range(size):
            for micro in range(passes):
                (local_loss(r, micro, step, ref_layers) / size).backward()
        for _, p in ref_named:
            if p.grad is None:  # unused everywhere: a zero gradient, as in Horovod
                p.grad = torch.zeros_like(p)
        ref_opt.step()
    opt.remove_hooks()
    return {
        "dist": [p.detach().clone() for _, p in named],
        "ref": [p.detach().clone() for _, p in ref_named],
        "idle_grads": [layers["idle"].weight.grad.clone(), layers["idle"].bias.grad.clone()],
    }


def scenario_rewrap(rank: int, size: int, steps: int = 3) -> dict[str, Any]:
    """Wrapping the same model twice (the old optimizer still alive): only the new one may reduce."""
    model, reference = make_model(0), make_model(0)
    old = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    train_side_by_side(model, opt, reference, ref_opt, steps, seed=300, rank=rank, size=size)
    opt.remove_hooks()
    return {"dist": params_of(model), "ref": params_of(reference), "old_alive": old is not None}


def scenario_async_inplace(rank: int, size: int) -> dict[str, Any]:
    """The in-place and asynchronous variants: results, identity of the returned tensors, Handle state."""
    out: dict[str, Any] = {}
    t = full(3, float(rank))
    handle = hvd.allreduce_async_(t)
    result = handle.wait()
    out["allreduce_async_"] = (result, result is t, handle.is_completed(), handle.wait() is t)
    floats, ints = full(2, float(rank)), full(4, rank, torch.int64)
    returned = hvd.grouped_allreduce_([floats, ints], op=hvd.Sum)
    out["grouped_allreduce_"] = (floats, ints, returned[0] is floats and returned[1] is ints)
    pair = [full(2, rank + 1.0), full((2, 2), 2.0 * rank, torch.float64)]
    grouped = hvd.grouped_allreduce_async_(pair, op=hvd.Max)
    waited = grouped.wait()
    out["grouped_allreduce_async_"] = (
        pair,
        waited[0] is pair[0] and waited[1] is pair[1],
        grouped.is_completed(),
    )
    b = full(2, float(rank))
    out["broadcast_"] = (hvd.broadcast_(b, root_rank=size - 1) is b, b)
    return out


def scenario_errors_in_step(rank: int, size: int, outdir: Path) -> dict[str, Any]:
    """Failures that must reach every rank, after which the ranks must still be in step."""
    out: dict[str, Any] = {}
    dtype = torch.float32 if rank == 0 else torch.float64
    out["allgather_dtype_raised"] = raises(
        hvd.CollectivesError, hvd.allgather, torch.ones(2, dtype=dtype, device=DEVICE)
    )
    try:
        hvd.save_checkpoint({"f": lambda: 1}, outdir / "ckpt" / "bad.pt")  # a lambda cannot be pickled
        out["ckpt_failure"] = None
    except hvd.CollectivesError as error:
        out["ckpt_failure"] = (
            str(error),
            None if error.__cause__ is None else type(error.__cause__).__name__,
        )
    out["in_step_after_failures"] = hvd.allreduce(full(1, float(rank)), op=hvd.Sum)
    previous = os.umask(0o022)
    try:
        written = hvd.save_checkpoint({"w": torch.ones(1)}, outdir / "ckpt" / "mode.pt")
    finally:
        os.umask(previous)
    out["ckpt_mode"] = None if written is None else stat.S_IMODE(written.stat().st_mode)
    return out


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
    base = torch.tensor([rank + 1.0, 2.0 * (rank + 1)], device=DEVICE)
    out: dict[str, Any] = {
        op.name: hvd.allreduce(base, op=op) for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product)
    }
    out["input_unchanged"] = torch.equal(base, torch.tensor([rank + 1.0, 2.0 * (rank + 1)], device=DEVICE))
    out["async"] = hvd.allreduce_async(base, op=hvd.Sum).wait()
    inplace = base.clone()
    hvd.allreduce_(inplace)
    out["inplace"] = inplace
    out["grouped"] = hvd.grouped_allreduce([full(3, float(rank)), full((2, 2), float(rank), torch.float64)])
    out["grouped_sum_int"] = hvd.grouped_allreduce(
        [full(4, rank, torch.int64), full(2, float(rank))], op=hvd.Sum
    )
    out["allgather_uneven"] = hvd.allgather(full((rank + 1, 3), float(rank)))
    out["allgather_even"] = hvd.allgather(full(2, float(rank)))
    out["broadcast"] = hvd.broadcast(full(3, float(rank)), root_rank=size - 1)
    out["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=size - 1)
    send = torch.cat([full((j + 1, 2), 100.0 * rank + j) for j in range(size)])
    # With splits, Horovod also returns how many rows came from each rank.
    out["alltoall"], out["alltoall_received"] = hvd.alltoall(send, splits=[j + 1 for j in range(size)])
    out["alltoall_even"] = hvd.alltoall(torch.arange(size * 2.0, device=DEVICE) + 10 * rank)
    out["reduce_scatter_even"] = hvd.reduce_scatter(
        torch.arange(size * 2.0 * 2, device=DEVICE).view(size * 2, 2) * (rank + 1)
    )
    out["reduce_scatter_uneven"] = hvd.reduce_scatter(
        torch.arange(size * 2.0 + 1, device=DEVICE) * (rank + 1), op=hvd.Sum
    )
    out["metrics"] = hvd.average_metrics(
        {"loss": float(rank), "acc": torch.tensor(2.0 * rank, device=DEVICE)}
    )
    try:
        hvd.average_metrics({"a" if rank == 0 else "b": 1.0})
        out["metric_mismatch_raised"] = False
    except hvd.MetricKeysMismatchError:
        out["metric_mismatch_raised"] = True
    # Horovod truncates an integer average.
    out["int_average"] = hvd.allreduce(full(2, 3 * rank + 1, torch.int64))
    written = hvd.save_checkpoint(
        {"w": torch.arange(3.0, device=DEVICE), "epoch": 3}, outdir / "ckpt" / "model.pt"
    )
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


def adopt_group(rank: int, size: int) -> bool:
    """Create the default group as another library would, then let collectives.init() adopt it.

    Returns whether init() refused an environment whose RANK contradicts the group.
    """
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", init_method="env://")
    wrong = {"RANK": str((rank + 1) % size), "WORLD_SIZE": str(size)}
    refused = raises(hvd.EnvironmentContractError, hvd.init, "gloo", 60.0, wrong) and not hvd.is_initialized()
    # No RANK and no LOCAL_RANK: the placement must come from the group and the host names, not from
    # defaults (which would make every rank local rank 0).
    hvd.init(environ={})
    return refused


def main() -> None:
    global DEVICE
    outdir = Path(sys.argv[1])
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    refused = adopt_group(rank, size)
    assert (hvd.rank(), hvd.size()) == (rank, size)
    DEVICE = hvd.device()
    results = {
        "env_mismatch_refused": refused,
        "gradients": scenario_gradients(rank, size, hvd.Compression.none),
        "gradients_fp16": scenario_gradients(rank, size, hvd.Compression.fp16),
        "gradients_bf16": scenario_gradients(rank, size, hvd.Compression.bf16),
        "training": scenario_training(rank, size),
        "accumulation": scenario_accumulation(rank, size),
        "accumulation_early_step": scenario_accumulation_early_step(rank, size),
        "sum_op": scenario_sum_op(rank, size),
        "compressed_accumulation": scenario_compressed_accumulation(rank, size),
        "different_parameters": scenario_different_parameters(rank, size),
        "ddp": scenario_ddp(rank, size, hvd.Compression.none),
        "ddp_fp16": scenario_ddp(rank, size, hvd.Compression.fp16),
        "unused": scenario_unused(rank, size),
        "rewrap": scenario_rewrap(rank, size),
        "broadcast_state": scenario_broadcast_state(rank, size),
        "ops": scenario_ops(rank, size, outdir),
        "async_inplace": scenario_async_inplace(rank, size),
        "errors_in_step": scenario_errors_in_step(rank, size, outdir),
        "sharding": scenario_sharding(rank, size),
        "zero_grad_guard": scenario_zero_grad_guard(rank, size),
    }
    torch.save(to_cpu(results), outdir / f"rank{rank}.pt")
    hvd.shutdown()
    dist.destroy_process_group()  # adopted, so shutdown() leaves it to its creator


if __name__ == "__main__":
    main()
