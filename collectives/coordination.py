"""Horovod's ``join`` and ``barrier``: ranks that run out of data finish while the others go on.

A rank that calls :func:`join` keeps answering the other ranks' negotiation rounds with a JOIN row until
every rank has joined. While it waits it takes part, with zeros, in their allreduces (grouped, and
DistributedOptimizer's gradient buckets included), so Average still divides by the full set size, as in
Horovod; any other collective raises on the ranks that call it. The return value, equal on every rank, is
the rank that joined last.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from collectives.context import _Context, _require
from collectives.engines import engine_for
from collectives.negotiation import _AGREED, Agreement, Call, Kind, _joined_seen, dtype_of, op_of
from collectives.ops._handle import _agree, _turn
from collectives.process_sets import ProcessSet, global_process_set, groups_of
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups, _registered

__all__ = ["barrier", "join"]


class _JoinableStep(Protocol):
    def _join_step(self) -> None: ...


# Called by join() before its rounds, with the set: each takes part, at once, in what the other ranks may be
# doing without an agreement round (an optimizer's cached steps), and returns the works to wait for.
before_join: list[Callable[[_Groups], list[Any]]] = []

# Layout digest -> the DistributedOptimizer with that gradient layout in this process, so that a joined
# rank can take part in the other ranks' optimizer steps.
joinable_optimizers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` has reached the barrier."""
    _agree(Call(Kind.BARRIER), groups_of(process_set, "barrier"))


def _zeros_device(context: _Context, device: int) -> torch.device:
    if context.device_index is not None:
        return torch.device("cuda", context.device_index)
    return torch.device("cpu") if device < 0 else torch.device("cuda", device)


def _reduce_zeros(
    dtype: torch.dtype, numel: int, op: ReduceOp, device: torch.device, context: _Context
) -> None:
    zeros = torch.zeros(numel, dtype=dtype, device=device)
    cuda_average = op is ReduceOp.AVERAGE and context.device_type == "cuda" and zeros.is_floating_point()
    dist.all_reduce(zeros, op=dist.ReduceOp.AVG if cuda_average else dist.ReduceOp.SUM)


def _take_part(row: list[int], context: _Context, device: torch.device) -> _JoinableStep | None:
    """Contribute zeros to the collective the active ranks agreed on in ``row``; an optimizer's step is
    returned instead, to be taken part in once the turn is released (its buckets go through the engine)."""
    kind, op = row[0], op_of(row[3]) or ReduceOp.SUM
    dims = row[8 : 8 + row[6]]
    if kind == Kind.ALLREDUCE:
        numel = 1
        for d in dims:
            numel *= d
        _reduce_zeros(dtype_of(row[1]), numel, op, device, context)
    elif kind == Kind.GROUPED_ALLREDUCE:
        for code, numel in zip(dims[0::2], dims[1::2], strict=True):
            _reduce_zeros(dtype_of(code), numel, op, device, context)
    elif kind == Kind.OPTIMIZER_STEP:
        return joinable_optimizers.get(row[7])
    return None


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; return the rank that joined last, once all have.

    ``device`` is where the zeros for the other ranks' allreduces are made (-1: the CPU; under nccl always
    this rank's GPU).
    """
    context = _require("join")
    groups = _registered[0]
    if groups.size == 1:
        return context.topology.rank
    zeros_device = _zeros_device(context, device)
    engine = engine_for(groups)
    posted = [work for hook in before_join for work in hook(groups)]
    engine.stand_in = _stand_in(context, zeros_device)
    try:
        last = _join_rounds(groups, context, zeros_device)
    finally:
        engine.stand_in = None
    # Every other rank has taken part in these by now: in a step, or in its own join().
    for work in posted:
        work.wait()
    return last


def _stand_in(
    context: _Context, device: torch.device
) -> Callable[[list[int]], Callable[[Agreement], None] | None]:
    """How this joined rank takes part in a named operation of the others, given one of their rows."""

    def answer(row: list[int]) -> Callable[[Agreement], None] | None:
        if row[0] == Kind.ALLREDUCE and row[7] in joinable_optimizers:
            return None  # a bucket of an optimizer step: _join_step submits it under its own name
        if op_of(row[3]) not in (None, ReduceOp.SUM, ReduceOp.AVERAGE):
            return lambda agreement: None  # the others' verdict refuses it

        def take_part(agreement: Agreement) -> None:
            _take_part(row, context, device)

        return take_part

    return answer


def _join_rounds(groups: _Groups, context: _Context, zeros_device: torch.device) -> int:
    while True:
        step: _JoinableStep | None = None
        with _turn(Call(Kind.JOIN), groups) as agreement:
            rows = agreement.rows
            if len(agreement.joined) == groups.size:
                # Those seen joined before this last round (in the others' operations, ordered or named).
                before = set(_joined_seen)
                newly = [groups.ranks[i] for i in range(groups.size) if groups.ranks[i] not in before]
                _joined_seen.clear()
                return max(newly) if newly else max(groups.ranks)
            active = [row for row in rows if row[0] != Kind.JOIN]
            agreed = active[0][:_AGREED]
            if all(row[:_AGREED] == agreed for row in active):
                step = _take_part(active[0], context, zeros_device)
        if step is not None:
            step._join_step()
