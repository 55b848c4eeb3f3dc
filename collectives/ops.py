"""Horovod's tensor collectives on torch.distributed, with Horovod's signatures and semantics.

Every collective first agrees with its peers on what it is about to do (``collectives.negotiation``), so a
rank that passes another shape, dtype, op, name or root gets :class:`MismatchError` on every rank instead of
a hang. Out-of-place functions return new tensors and are differentiable as Horovod's are; in-place
variants end in ``_``; ``*_async`` variants return a :class:`Handle` for :func:`poll` and
:func:`synchronize`. All ranks of a process set must call its collectives in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from collectives.buckets import fuse, unflatten_into
from collectives.compression import Compression, Compressor
from collectives.context import _Context, _require
from collectives.errors import ArgumentError, CollectivesError
from collectives.negotiation import Agreement, Call, Kind, dtype_code, negotiate, shape_digest
from collectives.process_sets import ProcessSet, global_process_set, groups_of
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups

__all__ = [
    "Handle",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "poll",
    "reduce_scatter",
    "reducescatter",
    "reducescatter_async",
    "sparse_allreduce_async",
    "synchronize",
]

T = TypeVar("T")

_TORCH_OPS: dict[ReduceOp, Any] = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}

# Names of async operations started and not yet synchronized: Horovod refuses a second one of the same name.
_in_flight: set[str] = set()


class Handle(Generic[T]):
    """An operation in flight; :meth:`wait` (or :func:`synchronize`) blocks until done, gives the result."""

    def __init__(self, works: Sequence[dist.Work], finish: Callable[[], T], name: str | None = None) -> None:
        self._works = list(works)
        self._finish = finish
        self._result: T | None = None
        self._done = False
        self._name = name

    def is_completed(self) -> bool:
        """Whether the communication has finished (wait() will then not block on the network)."""
        return self._done or all(work.is_completed() for work in self._works)

    def wait(self) -> T:
        """Block until the operation is complete and return its result; later calls return it again."""
        if not self._done:
            try:
                for work in self._works:
                    work.wait()
                self._result = self._finish()
                self._done = True
            finally:
                if self._name is not None:
                    _in_flight.discard(self._name)
        return self._result  # type: ignore[return-value]


def _claim(name: str | None) -> None:
    if name is None:
        return
    if name in _in_flight:
        raise ArgumentError(
            f"an operation named {name!r} is in flight already: synchronize it before reusing the name"
        )
    _in_flight.add(name)


def _agree(call: Call, groups: _Groups, *, claim: bool) -> Agreement:
    """Agree on ``call`` with every rank of ``groups`` (:func:`negotiate`); ``claim``: an operation that
    outlives this call (``_async``, grouped) holds its name until it is synchronized, and frees it again when
    the ranks disagree."""
    if claim:
        _claim(call.name)
    try:
        return negotiate(call, groups)
    except BaseException:
        if claim:
            _in_flight.discard(call.name or "")
        raise


def poll(handle: Handle[Any]) -> bool:
    """Whether the operation behind ``handle`` has finished (Horovod's ``hvd.poll``)."""
    return handle.is_completed()


def synchronize(handle: Handle[T] | Callable[[], T]) -> T:
    """Wait for ``handle`` and return the operation's result (Horovod's ``hvd.synchronize``)."""
    if isinstance(handle, Handle):
        return handle.wait()
    return handle()


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


def _reduction(op: ReduceOp, tensor: torch.Tensor, context: _Context, size: int) -> tuple[Any, int]:
    """The torch.distributed op for ``op``, and the divisor to apply afterwards (1: none).

    NCCL averages floating tensors in the transport itself, with no extra pass; gloo has no AVG, so Average
    there is a sum followed by one division (truncating for integers, as Horovod's does).
    """
    if op is not ReduceOp.AVERAGE:
        return _TORCH_OPS[op], 1
    if context.device_type == "cuda" and tensor.is_floating_point():
        return dist.ReduceOp.AVG, 1
    return dist.ReduceOp.SUM, size


def _divide(tensor: torch.Tensor, divisor: int) -> None:
    if divisor == 1:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(divisor)
    else:
        tensor.div_(divisor, rounding_mode="trunc")


def _scale(tensor: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_(tensor * factor)


# ---------------------------------------------------------------------------------------------- allreduce


def _allreduce_start(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    op: ReduceOp,
    name: str | None,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    what: str,
    blocking: bool,
) -> Handle[torch.Tensor]:
    """Reduce ``tensor`` in place; blocking skips a Work round trip through Python on the common path."""
    context = _require(what)
    groups = groups_of(process_set, what)
    _agree(
        Call(Kind.ALLREDUCE, name, tensor.dtype, tensor.device.type, op, shape=tuple(tensor.shape)),
        groups,
        claim=not blocking,
    )
    _scale(tensor, prescale)
    torch_op, divisor = _reduction(op, tensor, context, groups.size)

    def finish() -> torch.Tensor:
        _divide(tensor, divisor)
        _scale(tensor, postscale)
        return tensor

    if blocking:
        dist.all_reduce(tensor, op=torch_op, group=groups.data)
        return Handle([], finish)
    work = dist.all_reduce(tensor, op=torch_op, group=groups.data, async_op=True)
    return Handle([work], finish, name)


def allreduce_async_(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start reducing ``tensor`` in place (Average by default); the handle's result is ``tensor``."""
    return _allreduce_start(
        tensor,
        _op_from(average, op),
        name,
        prescale_factor,
        postscale_factor,
        process_set,
        "allreduce_async_",
        False,
    )


def allreduce_async(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle[torch.Tensor]:
    """Start reducing a copy of ``tensor``; the handle's result is the reduced copy."""
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def allreduce_(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` in place across the ranks of ``process_set`` (Average by default) and return it."""
    return _allreduce_start(
        tensor,
        _op_from(average, op),
        name,
        prescale_factor,
        postscale_factor,
        process_set,
        "allreduce_",
        True,
    ).wait()


class _AllreduceFunction(torch.autograd.Function):
    """Horovod's gradient of an allreduce: the same allreduce of the incoming gradient."""

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
        return _allreduce_start(
            tensor.detach().clone(), op, name, prescale, postscale, process_set, "allreduce", True
        ).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.args
        reduced = _allreduce_start(
            grad.detach().clone(), op, None, prescale, postscale, process_set, "allreduce", True
        ).wait()
        return reduced, None, None, None, None, None


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def allreduce(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    compression: Compressor | Any = Compression.none,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return the reduction of ``tensor`` across ranks (Average by default); ``tensor`` is left unchanged.

    Differentiable: the gradient is the same reduction of the incoming gradient. ``compression`` casts for
    the wire and back (Horovod's compressor interface).
    """
    reduce_op = _op_from(average, op)
    wire, ctx = compression.compress(tensor)
    if _needs_grad(wire):
        result: torch.Tensor = _AllreduceFunction.apply(  # type: ignore[no-untyped-call]
            wire, reduce_op, name, prescale_factor, postscale_factor, process_set
        )
    else:
        result = _allreduce_start(
            wire.detach().clone() if wire is tensor else wire,
            reduce_op,
            name,
            prescale_factor,
            postscale_factor,
            process_set,
            "allreduce",
            True,
        ).wait()
    out: torch.Tensor = compression.decompress(result, ctx)
    return out


def fused_buffers_shape(buffers: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The fused buffers as (dtype code, length) pairs: what a joined rank needs to take part with zeros."""
    if len(buffers) > 8:
        return ()
    return tuple(v for flat in buffers for v in (dtype_code(flat.dtype), flat.numel()))


def _grouped_allreduce_start(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    name: str | None,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    what: str,
) -> Handle[list[torch.Tensor]]:
    """Reduce ``tensors`` in place, fused into one flat buffer per dtype and device."""
    context = _require(what)
    groups = groups_of(process_set, what)
    targets = list(tensors)
    fused = fuse(targets) if targets else []
    device = targets[0].device.type if targets else "cpu"
    _agree(
        Call(
            Kind.GROUPED_ALLREDUCE,
            name,
            device=device,
            op=op,
            shape=fused_buffers_shape([flat for _, flat in fused]),
            digest=shape_digest(targets),
        ),
        groups,
        claim=True,
    )
    works: list[dist.Work] = []
    divisors: list[int] = []
    for _, flat in fused:
        _scale(flat, prescale)
        torch_op, divisor = _reduction(op, flat, context, groups.size)
        works.append(dist.all_reduce(flat, op=torch_op, group=groups.data, async_op=True))
        divisors.append(divisor)

    def result() -> list[torch.Tensor]:
        for (members, flat), divisor in zip(fused, divisors, strict=True):
            _divide(flat, divisor)
            _scale(flat, postscale)
            unflatten_into(flat, members)
        return targets

    return Handle(works, result, name)


def grouped_allreduce_async_(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle[list[torch.Tensor]]:
    """Start reducing ``tensors`` in place as one fused operation."""
    return _grouped_allreduce_start(
        tensors,
        _op_from(average, op),
        name,
        prescale_factor,
        postscale_factor,
        process_set,
        "grouped_allreduce_async_",
    )


def grouped_allreduce_async(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle[list[torch.Tensor]]:
    """Start reducing copies of ``tensors`` as one fused operation."""
    return grouped_allreduce_async_(
        [t.detach().clone() for t in tensors],
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


def grouped_allreduce_(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` in place (fused per dtype and device) and return them."""
    return grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set
    ).wait()


class _GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # noqa: PLR0917 (Horovod's signature)
        ctx: Any,
        op: ReduceOp,
        name: str | None,
        prescale: float,
        postscale: float,
        process_set: ProcessSet,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, prescale, postscale, process_set)
        copies = [t.detach().clone() for t in tensors]
        return tuple(
            _grouped_allreduce_start(
                copies, op, name, prescale, postscale, process_set, "grouped_allreduce"
            ).wait()
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.args
        copies = [g.detach().clone() for g in grads]
        reduced = _grouped_allreduce_start(
            copies, op, None, prescale, postscale, process_set, "grouped_allreduce"
        ).wait()
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    average: bool | ReduceOp | None = None,
    name: str | None = None,
    compression: Compressor | Any = Compression.none,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Return the reductions of ``tensors`` (fused per dtype and device); differentiable."""
    reduce_op = _op_from(average, op)
    compressed = [compression.compress(t) for t in tensors]
    wires = [wire for wire, _ in compressed]
    if _needs_grad(*wires):
        results = list(
            _GroupedAllreduceFunction.apply(  # type: ignore[no-untyped-call]
                reduce_op, name, prescale_factor, postscale_factor, process_set, *wires
            )
        )
    else:
        results = _grouped_allreduce_start(
            [w.detach().clone() for w in wires],
            reduce_op,
            name,
            prescale_factor,
            postscale_factor,
            process_set,
            "grouped_allreduce",
        ).wait()
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed, strict=True)]


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp | None = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by gathering every rank's indices and values (Horovod's way); returns a
    callable for :func:`synchronize` that gives the (uncoalesced) sparse sum, or average."""
    reduce_op = _op_from(None, op)
    if reduce_op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ArgumentError(f"sparse_allreduce supports Sum and Average, got {reduce_op}")
    # Gathered along the first dimension, so the (ndim, nnz) indices travel transposed.
    indices = allgather_async(
        tensor._indices().t().contiguous(), None if name is None else f"{name}.indices", process_set
    )
    values = allgather_async(tensor._values(), None if name is None else f"{name}.values", process_set)
    size = groups_of(process_set, "sparse_allreduce_async").size

    def result() -> torch.Tensor:
        gathered_values = values.wait()
        gathered_indices = indices.wait()
        if reduce_op is ReduceOp.AVERAGE:
            gathered_values = gathered_values / size
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, tensor.size())

    return result


# ---------------------------------------------------------------------------------------------- allgather

# Types that both gloo and NCCL carry. Collectives that only move data (allgather, broadcast, alltoall) send
# any other type (int16, bool, ...) as its bytes, which is exact.
_CARRIED = {torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64}


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


def _all_gather_into(output: torch.Tensor, local: torch.Tensor, group: Any, async_op: bool) -> Any:
    # all_gather_single replaces the deprecated all_gather_into_tensor in newer torch.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, local, group=group, async_op=async_op)


def _allgather_start(
    tensor: torch.Tensor, name: str | None, process_set: ProcessSet, what: str, blocking: bool
) -> Handle[torch.Tensor]:
    _require(what)
    groups = groups_of(process_set, what)
    local = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    # The rows carry each rank's first dimension, so the sizes cost no exchange of their own.
    agreement = _agree(
        Call(
            Kind.ALLGATHER,
            name,
            local.dtype,
            local.device.type,
            shape=tuple(local.shape[1:]),
            free=(local.shape[0],),
        ),
        groups,
        claim=not blocking,
    )
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

    if blocking:
        _all_gather_into(gathered, send, groups.data, False)
        return Handle([], finish)
    return Handle([_all_gather_into(gathered, send, groups.data, True)], finish, name)


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
    return Handle([w for h in handles for w in h._works], lambda: [h.wait() for h in handles])


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """The allgather of each tensor of ``tensors``; differentiable."""
    return [allgather(t, None if name is None else f"{name}.{i}", process_set) for i, t in enumerate(tensors)]


# ---------------------------------------------------------------------------------------------- broadcast


def _broadcast_start(  # noqa: PLR0917 (Horovod's signature)
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None,
    process_set: ProcessSet,
    what: str,
    blocking: bool,
) -> Handle[torch.Tensor]:
    _require(what)
    groups = groups_of(process_set, what)
    if root_rank not in groups.ranks:
        raise ArgumentError(f"{what}: root_rank {root_rank} is not a rank of {process_set!r}")
    _agree(
        Call(
            Kind.BROADCAST,
            name,
            tensor.dtype,
            tensor.device.type,
            root=root_rank,
            shape=tuple(tensor.shape),
        ),
        groups,
        claim=not blocking,
    )
    # The bytes of a type the backend lacks, in place when the tensor is contiguous.
    carried = tensor
    if tensor.dtype not in _CARRIED:
        carried = tensor.contiguous().reshape(-1).view(torch.uint8)

    def finish() -> torch.Tensor:
        if carried.data_ptr() != tensor.data_ptr():
            tensor.copy_(carried.view(tensor.dtype).view(tensor.shape))
        return tensor

    if blocking:
        dist.broadcast(carried, src=root_rank, group=groups.data)
        return Handle([], finish)
    work = dist.broadcast(carried, src=root_rank, group=groups.data, async_op=True)
    return Handle([work], finish, name)


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


# ---------------------------------------------------------------------------------------------- alltoall


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
    context = _require(what)
    groups = groups_of(process_set, what)
    send = _split_counts(tensor, splits, groups.size)
    _agree(
        Call(Kind.ALLTOALL, name, tensor.dtype, tensor.device.type, shape=tuple(tensor.shape[1:])),
        groups,
        claim=not blocking,
    )
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
        async_op=not blocking,
    )

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        return _from_rows(out, tensor.dtype, tuple(tensor.shape[1:])), received

    return Handle([] if blocking else [work], finish, None if blocking else name)


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
    context = _require(what)
    groups = groups_of(process_set, what)
    if tensor.dim() == 0:
        raise ArgumentError(f"{what} needs a tensor of at least one dimension")
    _agree(
        Call(Kind.REDUCESCATTER, name, tensor.dtype, tensor.device.type, op, shape=tuple(tensor.shape)),
        groups,
        claim=not blocking,
    )
    world, me = groups.size, groups.index or 0
    rows = tensor.shape[0]
    base, extra = divmod(rows, world)
    start = me * base + min(me, extra)
    count = base + (1 if me < extra else 0)
    work = tensor.detach().clone()
    _scale(work, prescale)
    torch_op, divisor = _reduction(op, work, context, world)
    if extra == 0:
        out = torch.empty((count, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        # reduce_scatter_single replaces the deprecated reduce_scatter_tensor in newer torch.
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        pending = fn(out, work.contiguous(), op=torch_op, group=groups.data, async_op=not blocking)
    else:
        # Uneven rows: the collective wants equal slices, and padding costs as much as reducing it all.
        out = work
        pending = dist.all_reduce(work, op=torch_op, group=groups.data, async_op=not blocking)

    def finish() -> torch.Tensor:
        result = out if extra == 0 else out[start : start + count].clone()
        _divide(result, divisor)
        _scale(result, postscale)
        return result

    return Handle([] if blocking else [pending], finish, None if blocking else name)


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
    reduce_op = _op_from(None, op)
    if reduce_op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ArgumentError(f"reducescatter supports Sum and Average, got {reduce_op}")
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
    reduce_op = _op_from(None, op)
    if reduce_op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ArgumentError(f"reducescatter supports Sum and Average, got {reduce_op}")
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
    return Handle([w for h in handles for w in h._works], lambda: [h.wait() for h in handles])


def reduce_scatter(
    tensor: torch.Tensor, op: ReduceOp = ReduceOp.AVERAGE, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """This library's earlier name for :func:`reducescatter`, with ``op`` second."""
    return reducescatter(tensor, op=op, process_set=process_set)
