"""One rank of the Horovod-API job: runs every scenario and saves what it saw for the test to judge.

Usage (under distrun): horovod_api_worker.py OUTDIR. Each rank writes OUTDIR/rank{RANK}.pt: a dict from
scenario name to plain values (tensors on the CPU, exception class names and messages). Scenarios in which
ranks disagree on purpose record the error each rank got; the job goes on afterwards, which is itself the
check that a mismatch leaves every rank in step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import collectives as hvd


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What ``fn`` did on this rank: its value, or the class and message of what it raised."""
    try:
        return {"value": fn()}
    except Exception as error:
        return {
            "error": type(error).__name__,
            "message": str(error),
            "mismatch": isinstance(error, hvd.MismatchError),
        }


def mismatches(rank: int, size: int) -> dict[str, Any]:
    last = size - 1
    other = rank == last
    return {
        "shape": outcome(lambda: hvd.allreduce(torch.ones(3 + (1 if other else 0)))),
        "rank_of_tensor": outcome(lambda: hvd.allreduce(torch.ones(6) if other else torch.ones(2, 3))),
        "dtype": outcome(lambda: hvd.allreduce(torch.ones(4, dtype=torch.int32 if other else torch.float32))),
        "op": outcome(lambda: hvd.allreduce(torch.ones(4), op=hvd.Max if other else hvd.Sum)),
        "name": outcome(lambda: hvd.allreduce(torch.ones(4), name="b" if other else "a")),
        "root": outcome(lambda: hvd.broadcast(torch.ones(4), root_rank=1 if other else 0)),
        "allgather_trailing": outcome(lambda: hvd.allgather(torch.ones(2, 3 if other else 4))),
        "collective": outcome(
            lambda: hvd.allgather(torch.ones(2)) if other else hvd.allreduce(torch.ones(2), op=hvd.Sum)
        ),
        # A rank that is still in a barrier (a test that left early, then its tearDown) while the others
        # register a process set: both raise, rather than wait on two channels.
        "process_set": outcome(lambda: hvd.barrier() if other else hvd.add_process_set([0, 1])),
        # The same with shutdown(): the ranks that would leave stay initialised, and nobody waits for ever.
        "shutdown": outcome(lambda: hvd.barrier() if other else hvd.shutdown()),
        # After all of that every rank is still in step: a correct collective gives the right answer.
        "after": outcome(lambda: hvd.allreduce(torch.full((2,), float(rank)), op=hvd.Sum)),
    }


def apis(rank: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t = torch.arange(4.0) + rank
    out["allreduce_average_positional"] = hvd.allreduce(t, True)
    out["allreduce_sum_scaled"] = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    out["allreduce_int_average"] = hvd.allreduce(torch.tensor([rank * 3 + 1]), average=True)
    inplace = t.clone()
    hvd.allreduce_(inplace, None, "inplace", hvd.Sum)
    out["allreduce_inplace_positional"] = inplace
    handle = hvd.allreduce_async(t, name="async.t", op=hvd.Sum)
    out["duplicate_name"] = outcome(lambda: hvd.allreduce_async(t, name="async.t"))
    # A blocking call under the same name that the ranks disagree on leaves the async operation's name held.
    out["blocking_mismatch"] = outcome(lambda: hvd.allreduce(torch.ones(rank + 1), name="async.t"))
    out["duplicate_name_after_mismatch"] = outcome(lambda: hvd.allreduce_async(t, name="async.t"))
    out["async_result"] = hvd.synchronize(handle)
    out["poll_after_synchronize"] = hvd.poll(handle)
    out["grouped"] = hvd.grouped_allreduce([t, torch.ones(2, dtype=torch.float64) * rank], op=hvd.Sum)
    out["allgather_variable"] = hvd.allgather(torch.full((rank + 1, 2), float(rank)))
    out["broadcast_async"] = hvd.synchronize(hvd.broadcast_async(t, root_rank=size - 1))
    splits = [1 + (rank + r) % 2 for r in range(size)]
    data = torch.arange(float(sum(splits))) + 100 * rank
    out["alltoall_splits"] = hvd.alltoall(data, splits=splits)
    out["alltoall_even"] = hvd.alltoall(torch.arange(float(2 * size)) + 100 * rank)
    out["reducescatter_uneven"] = hvd.reducescatter(torch.ones(2 * size + 1, 2) * (rank + 1), op=hvd.Sum)
    out["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=size - 1)
    out["allgather_object"] = hvd.allgather_object(rank * 10)
    sparse = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([[1.0, 2.0]]), (size, 2))
    out["sparse_sum"] = hvd.synchronize(hvd.sparse_allreduce_async(sparse, "sparse", hvd.Sum)).to_dense()
    x = (torch.arange(3.0) + rank).requires_grad_()
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    out["allreduce_grad"] = x.grad
    y = torch.ones(rank + 1, 2, requires_grad=True)
    (hvd.allgather(y) * 2).sum().backward()
    out["allgather_grad"] = y.grad
    wire, ctx = hvd.Compression.fp16.compress(torch.ones(3, dtype=torch.float64))
    out["compression"] = (wire.dtype, hvd.Compression.fp16.decompress(wire, ctx).dtype)
    out["features"] = {
        "mpi_enabled": hvd.mpi_enabled(),
        "gloo_enabled": hvd.gloo_enabled(),
        "ccl_built": hvd.ccl_built(),
        "timeline": outcome(lambda: hvd.start_timeline("/tmp/t.json")),
        "adasum": outcome(lambda: hvd.allreduce(t, op=hvd.Adasum)),
    }
    hvd.barrier()
    return out


def process_sets(rank: int, size: int) -> dict[str, Any]:
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([r for r in range(size) if r % 2 == 1]))
    mine = evens if rank % 2 == 0 else odds
    out = {
        "sum": hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=mine),
        "rank_size_included": (mine.rank(), mine.size(), evens.included(), odds.included()),
        "broadcast": hvd.broadcast(torch.tensor([float(rank)]), root_rank=mine.ranks[-1], process_set=mine),
        "allgather": hvd.allgather(torch.tensor([rank]), process_set=mine),
        "not_a_member": outcome(
            lambda: hvd.allreduce(torch.ones(1), process_set=odds if rank % 2 == 0 else evens)
        ),
    }
    hvd.barrier(process_set=mine)
    out["removed"] = (hvd.remove_process_set(odds), hvd.remove_process_set(evens), evens.process_set_id)
    return out


def join(rank: int, size: int) -> dict[str, Any]:
    first = size - 1
    results: dict[str, Any] = {}
    if rank == first:
        results["join_returned"] = hvd.join()
    else:
        a = torch.full((3,), float(rank + 1))
        results["average_with_joined"] = hvd.allreduce(a, op=hvd.Average, name="join.a")
        results["grouped_with_joined"] = hvd.grouped_allreduce([a, a.double()], op=hvd.Sum)
        results["allgather_with_joined"] = outcome(lambda: hvd.allgather(a))
        results["join_returned"] = hvd.join()
    results["join_everywhere"] = hvd.allgather_object(results["join_returned"])
    return results


def optimizer_join(rank: int, size: int) -> dict[str, Any]:
    """Ranks with fewer batches join; the others keep stepping, their gradients averaged over all ranks."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    grads = []
    batches = 1 if rank == 0 else 3
    for _ in range(batches):
        opt.zero_grad()
        # d(sum(w . x))/dw = x: each rank's gradient is (rank + 1) * [1, 1].
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        opt.step()
        assert model.weight.grad is not None
        grads.append(model.weight.grad.clone())
    last = hvd.join()
    return {"grads": grads, "last": last, "unagreed": opt._agreement.steps_unagreed}


def optimizer_join_two_optimizers(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 joins while its optimizer's next step was to go out unagreed; the others step another
    optimizer first, then that one, then join; then everyone steps again, as in a next epoch."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    opts = [
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), m.named_parameters(prefix=p))
        for m, p in ((first, "first"), (second, "second"))
    ]

    def step(which: int) -> torch.Tensor:
        model = (first, second)[which]
        opts[which].zero_grad()
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        opts[which].step()
        assert model.weight.grad is not None
        return model.weight.grad.clone()

    before = [step(0), step(0)]
    alone = [step(1), step(0)] if rank != 0 else []
    last = hvd.join()
    after = [step(0), step(0)]
    return {
        "before": before,
        "alone": alone,
        "after": after,
        "last": last,
        "unagreed": opts[0]._agreement.steps_unagreed,
        "in_step": hvd.allreduce(torch.ones(1), op=hvd.Sum),
    }


def optimizer_mismatch(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 steps while the others allgather: both sides raise, neither hangs."""
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())

    def step() -> None:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()

    result = outcome(step if rank == 0 else lambda: hvd.allgather(torch.ones(1)))
    opt.remove_hooks()
    return {"result": result, "after": hvd.allreduce(torch.ones(1), op=hvd.Sum)}


def optimizer_state(rank: int, size: int) -> dict[str, Any]:
    """broadcast_optimizer_state on fresh optimizers, one parameter of which never gets a gradient."""
    torch.manual_seed(rank)
    frozen = torch.nn.Parameter(torch.tensor([1, 3]), requires_grad=False)
    weights = torch.nn.Parameter(torch.rand(4))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([frozen, weights], lr=0.1, momentum=0.9, weight_decay=0.1),
        [("frozen", frozen), ("weights", weights)],
    )
    before = weights.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    return {
        "frozen_grad_is_none": frozen.grad is None,
        "weights_grad": weights.grad,
        "weights_unchanged": bool(torch.equal(before, weights.detach())),
        "momentum": opt.state[weights]["momentum_buffer"],
    }


def main() -> None:
    outdir = Path(sys.argv[1])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {
        "mismatches": mismatches(rank, size),
        "apis": apis(rank, size),
        "process_sets": process_sets(rank, size),
        "join": join(rank, size),
        "optimizer_join": optimizer_join(rank, size),
        "optimizer_join_two": optimizer_join_two_optimizers(rank, size),
        "optimizer_mismatch": optimizer_mismatch(rank, size),
        "optimizer_state": optimizer_state(rank, size),
    }
    torch.save(results, outdir / f"rank{rank}.pt")
    hvd.shutdown()


if __name__ == "__main__":
    main()
