"""What the collective families share: Horovod's op argument, the reduction's scaling chain, and the layout in
which the data-moving collectives carry tensors of any type."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.context import _Context
from collectives.errors import ArgumentError, CollectivesError
from collectives.reduce_op import ReduceOp

_TORCH_OPS: dict[ReduceOp, Any] = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}

# Types that both gloo and NCCL carry. Collectives that only move data (allgather, broadcast, alltoall) send
# any other type (int16, bool, ...) as its bytes, which is exact.
_CARRIED = {torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64}


def _comm_device(context: _Context) -> torch.device:
    """Where small bookkeeping tensors (sizes, splits) must live for this backend."""
    if context.device_index is not None:
        return torch.device("cuda", context.device_index)
    return torch.device("cpu")


def _op_from(average: bool | ReduceOp | None, op: ReduceOp | None) -> ReduceOp:
    """Horovod's op argument, with its deprecated ``average`` flag; a ReduceOp in ``average``'s place (this
    library's former second positional argument) counts as ``op``."""
    if isinstance(average, ReduceOp):
        average, op = None, average if op is None else op
    if average is not None and op is not None:
        raise ArgumentError("pass either op or the deprecated average, not both")
    if op is None:
        return ReduceOp.SUM if average is False else ReduceOp.AVERAGE
    if not isinstance(op, ReduceOp):
        raise CollectivesError(f"op must be one of collectives.Average/Sum/Min/Max/Product, got {op!r}")
    if op is ReduceOp.ADASUM:
        raise NotImplementedError(
            "Adasum needs Horovod's own MPI/NCCL implementation, which torch.distributed lacks; "
            "use op=Average (or Sum)"
        )
    return op


def _sum_or_average(op: ReduceOp | None, what: str) -> ReduceOp:
    """:func:`_op_from` for the collectives that reduce by summing only (reducescatter, sparse allreduce)."""
    reduce_op = _op_from(None, op)
    if reduce_op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ArgumentError(f"{what} supports Sum and Average, got {reduce_op}")
    return reduce_op


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _scale(tensor: torch.Tensor, factor: float) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_(tensor * factor)


def _prescaled(
    tensor: torch.Tensor, op: ReduceOp, prescale: float, context: _Context, size: int
) -> tuple[Any, int]:
    """Scale ``tensor`` in place by ``prescale``; return the torch.distributed op for ``op``, and the divisor
    that :func:`_postscaled` applies afterwards (1: none).

    NCCL averages floating tensors in the transport itself, with no extra pass; gloo has no AVG, so Average
    there is a sum followed by one division (truncating for integers, as Horovod's does).
    """
    if prescale != 1.0:
        _scale(tensor, prescale)
    if op is not ReduceOp.AVERAGE:
        return _TORCH_OPS[op], 1
    if context.device_type == "cuda" and tensor.is_floating_point():
        return dist.ReduceOp.AVG, 1
    return dist.ReduceOp.SUM, size


def _postscaled(tensor: torch.Tensor, divisor: int, postscale: float) -> torch.Tensor:
    """Finish, in place, a reduction that :func:`_prescaled` began: the division, then ``postscale``."""
    if divisor != 1:
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.div_(divisor)
        else:
            tensor.div_(divisor, rounding_mode="trunc")
    if postscale != 1.0:
        _scale(tensor, postscale)
    return tensor


def _rows_of(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (at least 1-d, contiguous) as a (rows, width) tensor of a type the backend carries."""
    rows = tensor.shape[0]
    width = 1
    for d in tensor.shape[1:]:
        width *= d
    flat = tensor.reshape(rows, width)
    return flat if tensor.dtype in _CARRIED else flat.view(torch.uint8)


def _from_rows(rows: torch.Tensor, dtype: torch.dtype, trailing: Sequence[int]) -> torch.Tensor:
    """The inverse of :func:`_rows_of` for ``rows`` rows of ``trailing``-shaped items of ``dtype``."""
    typed = rows if rows.dtype == dtype else rows.view(dtype)
    return typed.reshape(rows.shape[0], *trailing)


def carried(prescale: float, device_type: str, dtype: torch.dtype) -> bool:
    """Whether a reduction's bytes may travel as they are, in its round or a gather, for every rank to
    reduce (a CPU tensor of a type gloo carries, with no prescale); within ``payload_fits``'s limit."""
    return prescale == 1.0 and device_type == "cpu" and dtype in _CARRIED


_COMBINE: dict[ReduceOp, Callable[..., torch.Tensor]] = {
    ReduceOp.SUM: torch.add,
    ReduceOp.AVERAGE: torch.add,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.PRODUCT: torch.mul,
}


def reduce_payloads(
    op: ReduceOp, postscale: float
) -> Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor]:
    """Reduce every rank's bytes of a tensor (uint8, in set order, carried by its agreement round) into it:
    the same bits on every rank."""
    combine = _COMBINE[op]

    def reduce(tensor: torch.Tensor, payloads: list[torch.Tensor]) -> torch.Tensor:
        dtype, shape = tensor.dtype, tensor.shape
        parts = [p.view(dtype).view(shape) for p in payloads]
        combine(parts[0], parts[1], out=tensor)
        for part in parts[2:]:
            combine(tensor, part, out=tensor)
        return _postscaled(tensor, len(parts) if op is ReduceOp.AVERAGE else 1, postscale)

    return reduce


def reduce_block_payloads(
    op: ReduceOp, postscale: float
) -> Callable[[list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]:
    """:func:`reduce_payloads` for tensors whose bytes rode together (a block of cached allreduces, a grouped
    call's members): every rank's block reduced into the thread's kept buffer, then copied out into them."""
    reduce = reduce_payloads(op, postscale)

    def reduce_block(tensors: list[torch.Tensor], payloads: list[torch.Tensor]) -> list[torch.Tensor]:
        # Every rank's block holds the tensors' bytes back to back, as flattening them lays them out.
        flat, parts = block_buffer(tensors)
        reduce(flat, payloads)
        torch._foreach_copy_(tensors, parts)
        return tensors

    return reduce_block


# Per thread (the engine thread, or a caller that runs its own rounds: a thread runs one round at a time):
# the flat buffer that a block is reduced into and its views shaped like the block's tensors, kept while the
# block's shapes and type hold. A burst (or a grouped call) rides the same block every step, and making a
# view per tensor was most of its reduction's time.
_block_scratch = threading.local()


def block_buffer(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    shapes = [t.shape for t in tensors]
    dtype = tensors[0].dtype
    memo = getattr(_block_scratch, "memo", None)
    if memo is None or memo[1] is not dtype or memo[0] != shapes:
        flat = torch.empty(sum(shape.numel() for shape in shapes), dtype=dtype)
        parts = list(torch._C._nn.unflatten_dense_tensors(flat, tensors))
        memo = _block_scratch.memo = (shapes, dtype, flat, parts)
    return memo[2], memo[3]


def all_gather_into(output: torch.Tensor, local: torch.Tensor, group: Any, async_op: bool) -> Any:
    """Every rank's ``local`` into ``output``, one after another in rank order (a flat all_gather)."""
    # all_gather_single replaces the deprecated all_gather_into_tensor in newer torch.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, local, group=group, async_op=async_op)
