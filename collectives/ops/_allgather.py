"""Allgather: every rank's tensor concatenated along the first dimension, in rank order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from collectives.negotiation import Agreement, Call, Kind
from collectives.ops._allreduce import allreduce
from collectives.ops._common import _from_rows, _needs_grad, _rows_of, all_gather_into
from collectives.ops._handle import Handle, _combined, _submit
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set, groups_of
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups

__all__ = ["allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async"]


def _allgather_start(
    tensor: torch.Tensor, name: str | None, process_set: ProcessSet, what: str, blocking: bool
) -> Handle[torch.Tensor]:
    _, groups = context_and_groups(process_set, what)
    local = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    # The rows carry each rank's first dimension, so the sizes cost no exchange of their own.
    call = Call(
        Kind.ALLGATHER,
        name,
        local.dtype,
        local.device.type,
        shape=tuple(local.shape[1:]),
        free=(local.shape[0],),
    )

    def issue(agreement: Agreement) -> Handle[torch.Tensor]:
        return _issue_allgather(agreement, local, groups)

    return _submit(call, groups, issue, claim=not blocking, tensor=local)


def _issue_allgather(agreement: Agreement, local: torch.Tensor, groups: _Groups) -> Handle[torch.Tensor]:
    firsts = [agreement.free(i)[0] for i in range(groups.size)] if groups.size > 1 else [local.shape[0]]
    longest = max(firsts)
    trailing = tuple(local.shape[1:])
    rows = _rows_of(local.contiguous())
    gathered = torch.empty((groups.size * longest, rows.shape[1]), dtype=rows.dtype, device=local.device)
    if all(first == longest for first in firsts):
        send = rows

        def finish() -> torch.Tensor:
            return _from_rows(gathered, local.dtype, trailing)

    else:
        send = torch.zeros((longest, rows.shape[1]), dtype=rows.dtype, device=local.device)
        send[: local.shape[0]] = rows

        def finish() -> torch.Tensor:
            pieces = [gathered[r * longest : r * longest + firsts[r]] for r in range(groups.size)]
            return _from_rows(torch.cat(pieces), local.dtype, trailing)

    return Handle([all_gather_into(gathered, send, groups.data, True)], finish)


class _AllgatherFunction(torch.autograd.Function):
    """Horovod's gradient of an allgather: the averaged gradient's rows that this rank contributed."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return _allgather_start(tensor, name, process_set, "allgather", True).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        process_set: ProcessSet = ctx.process_set
        reduced = allreduce(grad, op=ReduceOp.AVERAGE, process_set=process_set)
        rows = _allgather_start(
            torch.tensor([ctx.rows], dtype=torch.int64), None, process_set, "allgather", True
        ).wait()
        me = groups_of(process_set, "allgather").index or 0
        offset = int(rows[:me].sum())
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle[torch.Tensor]:
    """Start concatenating every rank's ``tensor`` along the first dimension, in rank order."""
    return _allgather_start(tensor, name, process_set, "allgather_async", False)


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order; differentiable.

    The first dimension may differ across ranks; the other dimensions and the dtype must agree. A 0-d
    tensor counts as a 1-element vector.
    """
    if _needs_grad(tensor):
        out: torch.Tensor = _AllgatherFunction.apply(tensor, name, process_set)  # type: ignore[no-untyped-call]
        return out
    return _allgather_start(tensor, name, process_set, "allgather", True).wait()


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle[list[torch.Tensor]]:
    """Start an allgather of each tensor of ``tensors``."""
    handles = [
        allgather_async(t, None if name is None else f"{name}.{i}", process_set)
        for i, t in enumerate(tensors)
    ]
    return _combined(handles)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """The allgather of each tensor of ``tensors``; differentiable."""
    return [allgather(t, None if name is None else f"{name}.{i}", process_set) for i, t in enumerate(tensors)]
