"""Broadcast: every rank gets the root rank's tensor."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from collectives.context import _require
from collectives.errors import ArgumentError
from collectives.negotiation import Agreement, Call, Kind
from collectives.ops._allreduce import allreduce
from collectives.ops._common import _CARRIED, _needs_grad
from collectives.ops._handle import Handle, _submit
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups

__all__ = ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"]


def _broadcast_start(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None,
    process_set: ProcessSet,
    what: str,
    blocking: bool,
) -> Handle[torch.Tensor]:
    _, groups = context_and_groups(process_set, what)
    if root_rank not in groups.ranks:
        raise ArgumentError(f"{what}: root_rank {root_rank} is not a rank of {process_set!r}")
    call = Call(
        Kind.BROADCAST, name, tensor.dtype, tensor.device.type, root=root_rank, shape=tuple(tensor.shape)
    )

    def issue(agreement: Agreement) -> Handle[torch.Tensor]:
        return _issue_broadcast(tensor, root_rank, groups)

    return _submit(call, groups, issue, claim=not blocking, tensor=tensor)


def _issue_broadcast(tensor: torch.Tensor, root_rank: int, groups: _Groups) -> Handle[torch.Tensor]:
    # The bytes of a type the backend lacks, in place when the tensor is contiguous.
    carried = tensor
    if tensor.dtype not in _CARRIED:
        carried = tensor.contiguous().reshape(-1).view(torch.uint8)

    def finish() -> torch.Tensor:
        if carried.data_ptr() != tensor.data_ptr():
            tensor.copy_(carried.view(tensor.dtype).view(tensor.shape))
        return tensor

    work = dist.broadcast(carried, src=root_rank, group=groups.data, async_op=True)
    return Handle([work], finish)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start overwriting ``tensor`` with ``root_rank``'s."""
    return _broadcast_start(tensor, root_rank, name, process_set, "broadcast_async_", False)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start a broadcast into a copy of ``tensor``."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with its value on ``root_rank`` and return it."""
    return _broadcast_start(tensor, root_rank, name, process_set, "broadcast_", True).wait()


class _BroadcastFunction(torch.autograd.Function):
    """Horovod's gradient of a broadcast: the averaged gradient on the root, zeros elsewhere."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return broadcast_(tensor.detach().clone(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = allreduce(grad, op=ReduceOp.AVERAGE, process_set=ctx.process_set)
        if _require("broadcast").topology.rank != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank; the input is left unchanged; differentiable."""
    if _needs_grad(tensor):
        out: torch.Tensor = _BroadcastFunction.apply(  # type: ignore[no-untyped-call]
            tensor, root_rank, name, process_set
        )
        return out
    return broadcast_(tensor.detach().clone(), root_rank, name, process_set)
