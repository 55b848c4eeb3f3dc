"""Collective operations with Horovod's semantics, built on torch.distributed.

Functions return new tensors; the in-place variants end in ``_`` and return their argument. All ranks must
call the same collectives in the same order. Under nccl the tensors must live on the rank's GPU.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from collectives.buckets import fuse, unflatten_into
from collectives.context import _Context, _require
from collectives.errors import CollectivesError
from collectives.reduce_op import ReduceOp

__all__ = [
    "Handle",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async_",
    "reduce_scatter",
]

T = TypeVar("T")

_TORCH_OPS: dict[ReduceOp, Any] = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


class Handle(Generic[T]):
    """An operation in flight; :meth:`wait` blocks until it is done and returns its result."""

    def __init__(self, works: Sequence[dist.Work], finish: Callable[[], T]) -> None:
        self._works = list(works)
        self._finish = finish
        self._result: T | None = None
        self._done = False

    def is_completed(self) -> bool:
        """Whether the communication has finished (wait() will then not block on the network)."""
        return self._done or all(work.is_completed() for work in self._works)

    def wait(self) -> T:
        """Block until the operation is complete and return its result; later calls return it again."""
        if not self._done:
            for work in self._works:
                work.wait()
            self._result = self._finish()
            self._done = True
        return self._result  # type: ignore[return-value]


def _comm_device(context: _Context) -> torch.device:
    """Where small bookkeeping tensors (sizes, splits) must live for this backend."""
    if context.device_index is not None:
        return torch.device("cuda", context.device_index)
    return torch.device("cpu")


def _check_op(op: ReduceOp, tensor: torch.Tensor) -> None:
    if not isinstance(op, ReduceOp):
        raise CollectivesError(f"op must be one of collectives.Average/Sum/Min/Max/Product, got {op!r}")
    if op is ReduceOp.AVERAGE and not (tensor.is_floating_point() or tensor.is_complex()):
        raise CollectivesError(
            f"Average of a {tensor.dtype} tensor would have to round; use op=Sum and divide, "
            "or convert to a floating type first"
        )


def _reduction(op: ReduceOp, tensor: torch.Tensor, context: _Context) -> tuple[Any, int]:
    """The torch.distributed op for ``op``, and the divisor to apply afterwards (1: none).

    NCCL averages in the transport itself, with no extra pass over the tensor; gloo has no AVG, so Average
    there is a sum followed by one division.
    """
    _check_op(op, tensor)
    if op is not ReduceOp.AVERAGE:
        return _TORCH_OPS[op], 1
    if context.device_type == "cuda":
        return dist.ReduceOp.AVG, 1
    return dist.ReduceOp.SUM, context.topology.size


def _start_allreduce(
    tensor: torch.Tensor, op: ReduceOp, context: _Context
) -> tuple[dist.Work, Callable[[], None]]:
    """Start an in-place allreduce; the returned callable finishes it once the work is done."""
    torch_op, divisor = _reduction(op, tensor, context)
    work = dist.all_reduce(tensor, op=torch_op, async_op=True)
    return work, lambda: _divide(tensor, divisor)


def _divide(tensor: torch.Tensor, divisor: int) -> None:
    if divisor != 1:
        tensor.div_(divisor)


def allreduce_async_(tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE) -> Handle[torch.Tensor]:
    """Start reducing ``tensor`` in place across ranks; ``wait()`` returns ``tensor``."""
    context = _require("allreduce_async_")
    work, finish = _start_allreduce(tensor, op, context)

    def result() -> torch.Tensor:
        finish()
        return tensor

    return Handle([work], result)


def allreduce_async(tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE) -> Handle[torch.Tensor]:
    """Start reducing a copy of ``tensor`` across ranks; ``wait()`` returns the reduced copy."""
    _require("allreduce_async")
    return allreduce_async_(tensor.detach().clone(), op)


def _allreduce_now(tensor: torch.Tensor, op: ReduceOp, context: _Context) -> torch.Tensor:
    # The blocking call, not async + wait: it skips a Work round trip through Python on every call.
    torch_op, divisor = _reduction(op, tensor, context)
    dist.all_reduce(tensor, op=torch_op)
    _divide(tensor, divisor)
    return tensor


def allreduce_(tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE) -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks (Average by default) and return it."""
    return _allreduce_now(tensor, op, _require("allreduce_"))


def allreduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE) -> torch.Tensor:
    """Return the reduction of ``tensor`` across ranks (Average by default); ``tensor`` is left unchanged."""
    return _allreduce_now(tensor.detach().clone(), op, _require("allreduce"))


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], op: ReduceOp = ReduceOp.AVERAGE
) -> Handle[list[torch.Tensor]]:
    """Start reducing ``tensors`` in place, fused into one flat buffer per dtype and device."""
    context = _require("grouped_allreduce_async_")
    targets = list(tensors)
    pending: list[tuple[list[torch.Tensor], torch.Tensor, Callable[[], None]]] = []
    works: list[dist.Work] = []
    for members, flat in fuse(targets):
        work, finish = _start_allreduce(flat, op, context)
        works.append(work)
        pending.append((members, flat, finish))

    def result() -> list[torch.Tensor]:
        for members, flat, finish in pending:
            finish()
            unflatten_into(flat, members)
        return targets

    return Handle(works, result)


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], op: ReduceOp = ReduceOp.AVERAGE
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` in place (fused per dtype and device) and return them."""
    _require("grouped_allreduce_")
    return grouped_allreduce_async_(tensors, op).wait()


def grouped_allreduce(tensors: Sequence[torch.Tensor], op: ReduceOp = ReduceOp.AVERAGE) -> list[torch.Tensor]:
    """Return the reductions of ``tensors`` (fused per dtype and device); the inputs are left unchanged."""
    _require("grouped_allreduce")
    return grouped_allreduce_async_([t.detach().clone() for t in tensors], op).wait()


_MAX_GATHER_DIMS = 16
# Row exchanged by allgather: [ndim, dtype code, dim 0, dim 1, ...], padded with -1.
_ROW_LEN = _MAX_GATHER_DIMS + 2


def _dtype_code(dtype: torch.dtype) -> int:
    """A number naming ``dtype`` identically in every process (str(dtype) is stable, id() is not)."""
    return zlib.crc32(str(dtype).encode())


def _all_gather_into(output: torch.Tensor, local: torch.Tensor) -> None:
    # all_gather_single replaces the deprecated all_gather_into_tensor in newer torch.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, local)


def allgather(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ across ranks; the other dimensions and the dtype must agree. A 0-d
    tensor counts as a 1-element vector.
    """
    context = _require("allgather")
    world = context.topology.size
    local = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    if local.dim() > _MAX_GATHER_DIMS:
        raise CollectivesError(f"allgather supports at most {_MAX_GATHER_DIMS} dimensions, got {local.dim()}")
    # One small collective tells every rank every shape and dtype, so mismatches become errors on every rank
    # rather than hangs (different sizes) or garbage (the same bytes read as another dtype).
    row = torch.full((_ROW_LEN,), -1, dtype=torch.int64)
    row[0] = local.dim()
    row[1] = _dtype_code(local.dtype)
    row[2 : local.dim() + 2] = torch.tensor(local.shape, dtype=torch.int64)
    gathered_rows = torch.empty(world * _ROW_LEN, dtype=torch.int64, device=_comm_device(context))
    _all_gather_into(gathered_rows, row.to(gathered_rows.device))
    rows = gathered_rows.cpu().view(world, _ROW_LEN)
    codes = [int(code) for code in rows[:, 1]]
    if len(set(codes)) != 1:
        names = {_dtype_code(d): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
        dtypes = [names.get(code, f"unknown dtype {code}") for code in codes]
        raise CollectivesError(f"allgather needs the same dtype on every rank; by rank: {dtypes}")
    shapes = [tuple(int(d) for d in row[2 : int(row[0]) + 2]) for row in rows]
    trailing = {s[1:] for s in shapes}
    if len(trailing) != 1:
        raise CollectivesError(
            f"allgather needs the same shape after the first dimension on every rank: {shapes}"
        )
    firsts = [s[0] for s in shapes]
    longest = max(firsts)
    if all(first == longest for first in firsts):
        out = torch.empty((world * longest, *local.shape[1:]), dtype=local.dtype, device=local.device)
        _all_gather_into(out, local.contiguous())
        return out
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=local.device)
    padded[: local.shape[0]] = local
    gathered = torch.empty((world * longest, *local.shape[1:]), dtype=local.dtype, device=local.device)
    _all_gather_into(gathered, padded)
    pieces = [gathered[r * longest : r * longest + firsts[r]] for r in range(world)]
    return torch.cat(pieces)


def allgather_object(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, as a list in rank order."""
    context = _require("allgather_object")
    out: list[Any] = [None] * context.topology.size
    dist.all_gather_object(out, obj)
    return out


def broadcast_(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with its value on ``root_rank`` and return it."""
    _require("broadcast_")
    dist.broadcast(tensor, src=root_rank)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank; the input is left unchanged."""
    _require("broadcast")
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_object(obj: T, root_rank: int = 0) -> T:
    """Return ``root_rank``'s picklable ``obj`` on every rank (other ranks' ``obj`` is ignored)."""
    context = _require("broadcast_object")
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=root_rank, device=_comm_device(context))
    return box[0]  # type: ignore[no-any-return]


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """Send slice ``i`` of ``tensor`` (along the first dimension) to rank ``i``; return what arrived.

    ``splits[i]`` is the number of rows for rank ``i``; by default the rows are divided evenly. The result
    concatenates the rows received from ranks 0..n-1.
    """
    context = _require("alltoall")
    world = context.topology.size
    rows = tensor.shape[0] if tensor.dim() > 0 else 0
    if splits is None:
        if rows % world:
            raise CollectivesError(
                f"alltoall without splits needs the first dimension ({rows}) divisible by {world}"
            )
        send = [rows // world] * world
    else:
        send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(send) != world or sum(send) != rows or min(send) < 0:
        raise CollectivesError(
            f"alltoall splits {send} must be {world} non-negative counts summing to {rows}"
        )
    device = _comm_device(context)
    received_counts = torch.empty(world, dtype=torch.int64, device=device)
    dist.all_to_all_single(received_counts, torch.tensor(send, dtype=torch.int64, device=device))
    receive = [int(c) for c in received_counts.cpu()]
    out = torch.empty((sum(receive), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    dist.all_to_all_single(
        out, tensor.detach().contiguous(), output_split_sizes=receive, input_split_sizes=send
    )
    return out


def _reduce_scatter_into(output: torch.Tensor, flat_input: torch.Tensor, op: Any) -> None:
    # reduce_scatter_single replaces the deprecated reduce_scatter_tensor in newer torch.
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(output, flat_input, op=op)


def reduce_scatter(tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE) -> torch.Tensor:
    """Reduce ``tensor`` across ranks and return this rank's slice of the first dimension.

    As in Horovod the rows are split as evenly as possible, the lower ranks getting one extra row.
    """
    context = _require("reduce_scatter")
    world = context.topology.size
    me = context.topology.rank
    rows = tensor.shape[0]
    base, extra = divmod(rows, world)
    start = me * base + min(me, extra)
    count = base + (1 if me < extra else 0)
    if extra == 0:
        out = torch.empty((count, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        torch_op, divisor = _reduction(op, tensor, context)
        _reduce_scatter_into(out, tensor.detach().contiguous(), torch_op)
        _divide(out, divisor)
        return out
    # Uneven rows: the collective wants equal slices, and padding costs as much as reducing it all.
    reduced = allreduce(tensor, op)
    return reduced[start : start + count].clone()
