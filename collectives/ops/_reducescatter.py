"""Reducescatter: the reduction of every rank's tensor, each rank getting its own rows of the first
dimension."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.compression import Compression, Compressor
from collectives.context import _Context
from collectives.errors import ArgumentError
from collectives.negotiation import Agreement, Call, Kind
from collectives.ops._allgather import allgather
from collectives.ops._common import _needs_grad, _postscaled, _prescaled, _sum_or_average
from collectives.ops._handle import Handle, _combined, _submit
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set, groups_of
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups

__all__ = [
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "reduce_scatter",
    "reducescatter",
    "reducescatter_async",
]


def _reducescatter_start(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    op: ReduceOp,
    name: str | None,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    what: str,
    blocking: bool,
) -> Handle[torch.Tensor]:
    """This rank's rows of the reduction; as in Horovod the lower ranks get one extra row when uneven."""
    context, groups = context_and_groups(process_set, what)
    if tensor.dim() == 0:
        raise ArgumentError(f"{what} needs a tensor of at least one dimension")
    call = Call(Kind.REDUCESCATTER, name, tensor.dtype, tensor.device.type, op, shape=tuple(tensor.shape))

    def issue(agreement: Agreement) -> Handle[torch.Tensor]:
        return _issue_reducescatter(tensor, op, prescale, postscale, context, groups)

    return _submit(call, groups, issue, claim=not blocking, tensor=tensor)


def _issue_reducescatter(  # noqa: PLR0917 (the operation's parts)
    tensor: torch.Tensor, op: ReduceOp, prescale: float, postscale: float, context: _Context, groups: _Groups
) -> Handle[torch.Tensor]:
    world, me = groups.size, groups.index or 0
    rows = tensor.shape[0]
    base, extra = divmod(rows, world)
    start = me * base + min(me, extra)
    count = base + (1 if me < extra else 0)
    work = tensor.detach().clone()
    torch_op, divisor = _prescaled(work, op, prescale, context, world)
    if extra == 0:
        out = torch.empty((count, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        # reduce_scatter_single replaces the deprecated reduce_scatter_tensor in newer torch.
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        pending = fn(out, work.contiguous(), op=torch_op, group=groups.data, async_op=True)
    else:
        # Uneven rows: the collective wants equal slices, and padding costs as much as reducing it all.
        out = work
        pending = dist.all_reduce(work, op=torch_op, group=groups.data, async_op=True)

    def finish() -> torch.Tensor:
        result = out if extra == 0 else out[start : start + count].clone()
        return _postscaled(result, divisor, postscale)

    return Handle([pending], finish)


class _ReducescatterFunction(torch.autograd.Function):
    """Horovod's gradient of a reducescatter: the allgather of the incoming gradients, scaled alike."""

    @staticmethod
    def forward(  # noqa: PLR0917 (Horovod's signature)
        ctx: Any,
        tensor: torch.Tensor,
        op: ReduceOp,
        name: str | None,
        prescale: float,
        postscale: float,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.args = (op, prescale, postscale, process_set)
        return _reducescatter_start(
            tensor, op, name, prescale, postscale, process_set, "reducescatter", True
        ).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.args
        scale = prescale * postscale
        if op is ReduceOp.SUM:
            scale *= groups_of(process_set, "reducescatter").size
        return allgather(grad * scale, process_set=process_set), None, None, None, None, None


def reducescatter(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Compressor | Any = Compression.none,
    op: ReduceOp = ReduceOp.AVERAGE,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` across ranks and return this rank's rows of the first dimension; differentiable."""
    reduce_op = _sum_or_average(op, "reducescatter")
    wire, ctx = compression.compress(tensor)
    if _needs_grad(wire):
        result: torch.Tensor = _ReducescatterFunction.apply(  # type: ignore[no-untyped-call]
            wire, reduce_op, name, prescale_factor, postscale_factor, process_set
        )
    else:
        result = _reducescatter_start(
            wire, reduce_op, name, prescale_factor, postscale_factor, process_set, "reducescatter", True
        ).wait()
    out: torch.Tensor = compression.decompress(result, ctx)
    return out


def reducescatter_async(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle[torch.Tensor]:
    """Start a reducescatter; the handle's result is this rank's rows."""
    reduce_op = _sum_or_average(op, "reducescatter")
    return _reducescatter_start(
        tensor,
        reduce_op,
        name,
        prescale_factor,
        postscale_factor,
        process_set,
        "reducescatter_async",
        False,
    )


def grouped_reducescatter(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Compressor | Any = Compression.none,
    op: ReduceOp = ReduceOp.AVERAGE,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """The reducescatter of each tensor of ``tensors``."""
    return [
        reducescatter(
            t,
            None if name is None else f"{name}.{i}",
            compression,
            op,
            process_set,
            prescale_factor,
            postscale_factor,
        )
        for i, t in enumerate(tensors)
    ]


def grouped_reducescatter_async(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle[list[torch.Tensor]]:
    """Start the reducescatter of each tensor of ``tensors``."""
    handles = [
        reducescatter_async(
            t,
            None if name is None else f"{name}.{i}",
            op,
            process_set,
            prescale_factor,
            postscale_factor,
        )
        for i, t in enumerate(tensors)
    ]
    return _combined(handles)


def reduce_scatter(
    tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """This library's earlier name for :func:`reducescatter`, with ``op`` second."""
    return reducescatter(tensor, op=op, process_set=process_set)
