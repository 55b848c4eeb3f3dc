"""One rank of the engine scenarios (tests/integration/test_collectives_engine.py); prints one JSON line.

``kill <op|barrier|step>``: the last rank dies while the others wait on an operation it never submits, in a
barrier, or in an optimizer step; the survivors report what they raised.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import torch

import collectives as hvd
from collectives import engines

# An allreduce long enough (128 MB) to be still on the wire when its peer dies.
BIG = 32 * 1024 * 1024


class _StallSeen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        if "stall check" in record.getMessage():
            self.text = record.getMessage()
            self.seen.set()


def scenarios(rank: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = [f"order.{i}" for i in range(6)]
    mine = names if rank % 2 == 0 else names[::-1]
    handles = {
        n: hvd.allreduce_async(torch.full((4,), float(i + rank)), name=n, op=hvd.Sum)
        for i, n in enumerate(mine)
    }
    out["orders"] = {n: hvd.synchronize(handles[n]).tolist() for n in names}
    # Horovod's duplicate-name test: rank 0 submits, waits in a barrier, the others submit after it.
    if rank == 0:
        first = hvd.allreduce_async(torch.ones(3), name="dup")
        try:
            hvd.allreduce_async(torch.ones(3), name="dup")
            out["duplicate"] = "no error"
        except ValueError as error:
            out["duplicate"] = type(error).__name__
    hvd.barrier()
    if rank != 0:
        first = hvd.allreduce_async(torch.ones(3), name="dup")
        out["duplicate"] = "not submitted twice"
    out["dup_result"] = hvd.synchronize(first).tolist()
    try:
        hvd.allreduce(torch.ones(3 + (rank == size - 1)))
        out["mismatch"] = "no error"
    except hvd.MismatchError as error:
        out["mismatch"] = str(error)
    out["in_round"] = in_round(rank, size)
    issued = engines._engines[0].collectives_issued
    # 1-d and 2-d tensors fuse alike (the buffer's parts are copied back through flat views).
    small = [torch.full((64,) if i % 2 else (8, 8), float(rank)) for i in range(32)]
    for h in [hvd.allreduce_async_(t, name=f"fuse.{i}", op=hvd.Sum) for i, t in enumerate(small)]:
        hvd.synchronize(h)
    out["fused_collectives"] = engines._engines[0].collectives_issued - issued
    out["fused_values"] = sorted({v for t in small for v in t.reshape(-1).tolist()})
    # A burst seen before goes by the response cache's bits and fuses; small enough to ride, it is gathered
    # and reduced by every rank in rank order: every op. (Seen for the first time, it rides as rows.)
    for _ in range(2):
        ints = {
            op: [torch.full((16,), rank * 3 + 1, dtype=torch.int64) for _ in range(4)]
            for op in ("Min", "Max", "Average", "Product")
        }
        handles = [
            hvd.allreduce_async_(t, name=f"fuse.{op}.{i}", op=getattr(hvd, op))
            for op, tensors in ints.items()
            for i, t in enumerate(tensors)
        ]
        for handle in handles:
            hvd.synchronize(handle)
    out["fused_ops"] = {op: sorted({v for t in tensors for v in t.tolist()}) for op, tensors in ints.items()}
    out.update(riding_burst(rank, engines._engines[0]))
    out.update(burst_after_a_held_round(rank, engines._engines[0]))
    stall = _StallSeen()
    logging.getLogger("collectives").addHandler(stall)
    if rank == 0:
        lonely = hvd.allreduce_async(torch.ones(1), name="lonely")
        stall.seen.wait(60)
        out["stall"] = stall.text
        out["stall_thread"] = [t.name for t in threading.enumerate() if "stalled" in t.name]
    hvd.barrier()
    if rank != 0:
        lonely = hvd.allreduce_async(torch.ones(1), name="lonely")
    out["lonely"] = hvd.synchronize(lonely).tolist()
    out.update(between_backward_and_step(rank))
    return out


def riding_burst(rank: int, engine: Any) -> dict[str, Any]:
    """A burst of cached averages of one type (1-d and 2-d, submitted in another order on odd ranks): from
    its second time on its bytes ride behind its bits and every rank reduces them, with no collective; the
    values every time. Tried several times: a burst that a busy machine splits over two rounds goes by a
    collective instead."""
    names = [f"ride.{i}" for i in range(12)]
    order = names if rank % 2 == 0 else names[::-1]
    values, rode = [], False
    for attempt in range(10):
        tensors = {n: torch.full((16,) if i % 3 else (4, 4), float(rank + i)) for i, n in enumerate(names)}
        issued, reduced = engine.collectives_issued, engine.reduced_in_round
        handles = [hvd.allreduce_async_(tensors[n], name=n, op=hvd.Average) for n in order]
        for handle in handles:
            hvd.synchronize(handle)
        # The first burst, not cached yet, rides as rows with their payloads.
        by_bits = attempt > 0
        rode = rode or (
            by_bits and engine.collectives_issued == issued and engine.reduced_in_round - reduced == 12
        )
        values.append([sorted(set(tensors[n].reshape(-1).tolist())) for n in names])
    return {"ride_values": values, "rode": rode}


def burst_after_a_held_round(rank: int, engine: Any) -> dict[str, Any]:
    """A burst submitted just after a long round (one waiting for a slow peer, here the round lock held by
    hand) is its caller's round, and rides: the engine thread, woken meanwhile by an operation submitted
    during that round, finds the lock taken and waits to be told (the next caller's round wakes it). Queued
    on the lock, it took it as soon as it was freed, then waited for the interpreter while the caller
    submitted its burst, and ran the round itself (without the burst's block) while the caller waited."""
    names = [f"held.{i}" for i in range(16)]

    def burst() -> list[Any]:
        tensors = [torch.full((16,), float(rank + i)) for i in range(len(names))]
        return [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names, strict=True)]

    for handle in [*burst(), hvd.allreduce_async_(torch.ones(4), name="held.wake")]:
        hvd.synchronize(handle)  # both cached from now on
    taken: list[int] = []  # the new operations of every round the engine thread ran
    original = engine._round_locked

    def watched() -> Any:
        if threading.get_ident() == engine._thread.ident and engine._new:
            taken.append(len(engine._new))
        return original()

    engine._round_locked = watched
    values, missed, told = [], [], []
    try:
        for _ in range(3):
            with engine._round_lock._lock:  # held as a round holds it, freed without waking the thread
                wake = hvd.allreduce_async_(torch.ones(4), name="held.wake")
                missed.append(_until(lambda: engine._round_lock.missed))
            handles = burst()
            values.append([hvd.synchronize(h).tolist()[0] for h in handles])
            told.append(not engine._round_lock.missed)
            hvd.synchronize(wake)
    finally:
        del engine._round_locked
    return {"held_engine_rounds": taken, "held_values": values, "held_missed": missed, "held_told": told}


def _until(condition: Any, timeout: float = 30.0) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds (another thread makes it so)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def in_round(rank: int, size: int) -> dict[str, Any]:
    """Small blocking allreduces ride in their agreement round (no collective of their own): every op, an
    integer average (truncated), and a tensor too large to ride, which takes the data group."""
    engine = engines._engines[0]
    issued, reduced = engine.collectives_issued, engine.reduced_in_round
    value = torch.tensor([rank + 1.0, -(rank + 1.0), 0.5 * (rank + 1)])
    out: dict[str, Any] = {
        op: hvd.allreduce(value, op=getattr(hvd, op)).tolist()
        for op in ("Sum", "Average", "Min", "Max", "Product")
    }
    out["int_average"] = hvd.allreduce(torch.tensor([rank * 3 + 1]), op=hvd.Average).tolist()
    out["2-d"] = hvd.allreduce(torch.ones(2, 3, dtype=torch.float64), op=hvd.Sum).tolist()
    out["in_round"] = engine.reduced_in_round - reduced
    out["issued"] = engine.collectives_issued - issued
    out["large"] = hvd.allreduce(torch.ones(1 << 18), op=hvd.Sum)[:2].tolist()
    out["large_issued"] = engine.collectives_issued - issued
    out.update(grouped_in_round(rank, engine))
    return out


def grouped_in_round(rank: int, engine: Any) -> dict[str, Any]:
    """A grouped allreduce of 64 KB: over the round's first buffer at rest, so its first call takes the data
    group; the rounds then lengthen that buffer, and the calls after it ride in their round."""
    issued, reduced = engine.collectives_issued, engine.reduced_in_round
    results = []
    for op in (hvd.Sum, hvd.Sum, hvd.Average):
        tensors = [torch.full((64, 16), rank + 1.0), torch.full((16384 - 1024,), rank + 1.0)]
        returned = hvd.grouped_allreduce_(tensors, op=op)
        results.append(
            [returned[0] is tensors[0], tensors[0].shape == (64, 16)] + [t.unique().tolist() for t in tensors]
        )
    return {
        "grouped": results,
        "grouped_issued": engine.collectives_issued - issued,
        "grouped_in_round": engine.reduced_in_round - reduced,
    }


def between_backward_and_step(rank: int) -> dict[str, Any]:
    """Blocking collectives after ``backward()`` while a bucket is still unlaunched: the unused layer's
    bucket waits for ``step()``, which must not keep the other collectives from running meanwhile."""
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    params = [*used.named_parameters(prefix="used"), *unused.named_parameters(prefix="unused")]
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([p for _, p in params], lr=0.1), named_parameters=params, bucket_cap_mb=1e-6
    )
    out: dict[str, Any] = {}
    for step in range(2):
        opt.zero_grad()
        loss = used(torch.full((2, 4), float(rank + 1))).sum()
        loss.backward()
        out["loss_sum"] = hvd.allreduce(loss.detach(), op=hvd.Sum).item() != 0
        hvd.barrier()
        out["object"] = hvd.broadcast_object({"step": step}, root_rank=0)
        opt.step()
    out["grad_bias"] = used.bias.grad.tolist() if used.bias.grad is not None else None
    return {"between": out}


def kill(rank: int, size: int, during: str) -> dict[str, Any]:
    """The last rank dies; the others are inside ``during``: a pending async op ("op"), a barrier (an
    ordered turn), an optimizer step (its agreement and buckets) or a second one ("cached_step": its buckets,
    unagreed)."""
    device = hvd.device()  # the same worker runs on NCCL in tests/gpu
    model = torch.nn.Linear(4, 4).to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    hvd.allreduce(torch.ones(1, device=device))
    if during == "cached_step":
        # A first step together: the survivor's next one goes out unagreed, straight to the dead peer.
        model(torch.ones(2, 4, device=device)).sum().backward()
        opt.step()
    big = torch.ones(BIG if during == "issued" else 1, device=device)
    if rank == size - 1:
        if during == "issued":
            # Dies with the operation agreed and issued on the data group, its transfer under way.
            handle = hvd.allreduce_async(big, name="issued")
            assert handle._ticket is not None
            handle._ticket.result()
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        if during == "issued":
            hvd.synchronize(hvd.allreduce_async(big, name="issued"))
            # On the GPU the handle may come back before the transfer ends: a host sync must not hang.
            big.sum().item()
            hvd.allreduce(torch.ones(1, device=device))
        elif during == "barrier":
            hvd.barrier()
        elif during in ("step", "cached_step"):
            model(torch.ones(2, 4, device=device)).sum().backward()
            opt.step()
        else:
            hvd.synchronize(hvd.allreduce_async(torch.ones(8, device=device), name="never"))
        return {"outcome": "completed"}
    except hvd.HorovodInternalError as error:
        later: str
        try:
            hvd.allreduce(torch.ones(1, device=device))
            later = "completed"
        except hvd.HorovodInternalError:
            later = "HorovodInternalError"
        return {
            "outcome": "HorovodInternalError",
            "message": str(error)[:200],
            "later": later,
            "seconds": time.monotonic() - started,
        }


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    result = kill(rank, size, sys.argv[2]) if sys.argv[1] == "kill" else scenarios(rank, size)
    print("RESULT " + json.dumps({"rank": rank, **result}), flush=True)
    sys.stdout.flush()
    os._exit(0) if sys.argv[1] == "kill" else None


if __name__ == "__main__":
    main()
