"""Alltoall: each rank sends a run of its tensor's rows to every rank, and gets one run from each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.context import _Context
from collectives.errors import ArgumentError
from collectives.negotiation import Agreement, Call, Kind
from collectives.ops._common import _comm_device, _from_rows, _needs_grad, _rows_of
from collectives.ops._handle import Handle, _submit
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set
from collectives.registry import _Groups

__all__ = ["alltoall", "alltoall_async"]


def _split_counts(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None, size: int) -> list[int]:
    rows = tensor.shape[0] if tensor.dim() > 0 else 0
    if tensor.dim() == 0:
        raise ArgumentError("alltoall needs a tensor of at least one dimension")
    if splits is None:
        if rows % size:
            raise ArgumentError(
                f"alltoall without splits needs the first dimension ({rows}) divisible by {size}"
            )
        return [rows // size] * size
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ArgumentError(f"alltoall splits must be an int32 or int64 tensor, got {splits.dtype}")
        send = [int(s) for s in splits.tolist()]
    else:
        send = [int(s) for s in splits]
    if len(send) != size or sum(send) != rows or min(send) < 0:
        raise ArgumentError(f"alltoall splits {send} must be {size} non-negative counts summing to {rows}")
    return send


def _alltoall_start(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None,
    name: str | None,
    process_set: ProcessSet,
    what: str,
    blocking: bool,
) -> Handle[tuple[torch.Tensor, torch.Tensor]]:
    context, groups = context_and_groups(process_set, what)
    send = _split_counts(tensor, splits, groups.size)
    call = Call(Kind.ALLTOALL, name, tensor.dtype, tensor.device.type, shape=tuple(tensor.shape[1:]))

    def issue(agreement: Agreement) -> Handle[tuple[torch.Tensor, torch.Tensor]]:
        return _issue_alltoall(tensor, send, context, groups)

    return _submit(call, groups, issue, claim=not blocking, tensor=tensor)


def _issue_alltoall(
    tensor: torch.Tensor, send: list[int], context: _Context, groups: _Groups
) -> Handle[tuple[torch.Tensor, torch.Tensor]]:
    device = _comm_device(context)
    received_counts = torch.empty(groups.size, dtype=torch.int64, device=device)
    counts = torch.tensor(send, dtype=torch.int64, device=device)
    dist.all_to_all_single(received_counts, counts, group=groups.data)
    receive = [int(c) for c in received_counts.cpu()]
    rows = _rows_of(tensor.detach().contiguous())
    out = torch.empty((sum(receive), rows.shape[1]), dtype=rows.dtype, device=tensor.device)
    received = torch.tensor(receive, dtype=torch.int32)
    work = dist.all_to_all_single(
        out,
        rows,
        output_split_sizes=receive,
        input_split_sizes=send,
        group=groups.data,
        async_op=True,
    )

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        return _from_rows(out, tensor.dtype, tuple(tensor.shape[1:])), received

    return Handle([work], finish)


class _AlltoallFunction(torch.autograd.Function):
    """Horovod's gradient of an alltoall: the gradient sent back along the splits it arrived by."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        splits: Sequence[int] | torch.Tensor | None,
        name: str | None,
        process_set: ProcessSet,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = _alltoall_start(tensor, splits, name, process_set, "alltoall", True).wait()
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        back, _received = _alltoall_start(
            grad.contiguous(), ctx.received, None, ctx.process_set, "alltoall", True
        ).wait()
        return back, None, None, None


def alltoall_async(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle[tuple[torch.Tensor, torch.Tensor]]:
    """Start an alltoall; the handle's result is ``(output, received_splits)``."""
    return _alltoall_start(tensor, splits, name, process_set, "alltoall_async", False)


def alltoall(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send rows ``splits[i]`` of ``tensor`` (evenly divided by default) to rank ``i``; differentiable.

    Returns what arrived, concatenated in rank order, and, when ``splits`` is given, also the number of rows
    received from each rank (as Horovod does).
    """
    if _needs_grad(tensor):
        out, received = _AlltoallFunction.apply(tensor, splits, name, process_set)  # type: ignore[no-untyped-call]
    else:
        out, received = _alltoall_start(tensor, splits, name, process_set, "alltoall", True).wait()
    return out if splits is None else (out, received)


# ---------------------------------------------------------------------------------------------- reducescatter
