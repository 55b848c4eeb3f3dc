"""Allreduce: every rank gets the reduction (Average by default) of every rank's tensor."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from collectives.buckets import unflatten_into
from collectives.compression import Compression, Compressor
from collectives.engine_announce import payload_fits
from collectives.engine_values import Fusion
from collectives.negotiation import Agreement, Call, Kind, row_of
from collectives.ops._common import (
    _needs_grad,
    _op_from,
    _postscaled,
    _prescaled,
    all_gather_into,
    carried,
    reduce_block_payloads,
    reduce_payloads,
)
from collectives.ops._handle import Handle, _Part, _submit, _wait_work
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set
from collectives.reduce_op import ReduceOp

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_"]


_Reduce = Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor]
# Every rank's buffer gathered (rows in rank order), and how to reduce them into the fused buffer.
_Rows = tuple[torch.Tensor, Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor]]


# What a reduction needs beyond its tensor, built once per name, type, shape, op and scaling (Horovod caches
# its responses per tensor name): a loop that reduces the same named tensors every step builds each once.
class _Plan(NamedTuple):
    context: Any
    groups: Any
    call: Call
    row: list[int]
    fusion_key: Any
    issue_fused: Callable[[list[torch.Tensor]], list[_Part[torch.Tensor]]]
    reduce: _Reduce | None
    reduce_block: Callable[[list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]] | None
    nbytes: int


_plans: dict[tuple[Any, ...], _Plan] = {}
_PLANS_LIMIT = 4096


def _plan(  # noqa: PLR0917 (the facts of one request)
    facts: tuple[Any, ...],
    prescale: float,
    postscale: float,
    context: Any,
    groups: Any,
    nbytes: int,
    device: torch.device,
) -> _Plan:
    name, dtype, device_type, op, shape = facts
    call = Call(Kind.ALLREDUCE, name, dtype, device_type, op, shape=shape)

    as_bytes = carried(prescale, device_type, dtype)
    # Summed as rows by every rank in rank order (so the same bits everywhere) once gathered.
    sum_rows = reduce_payloads(ReduceOp.SUM if op is ReduceOp.AVERAGE else op, 1.0) if as_bytes else None

    def issue_fused(tensors: list[torch.Tensor]) -> list[_Part[torch.Tensor]]:
        flat = torch._C._nn.flatten_dense_tensors(tensors)  # one call, not a view and a copy per tensor
        torch_op, divisor = _prescaled(flat, op, prescale, context, groups.size)
        if sum_rows is not None and payload_fits(flat.numel() * flat.element_size(), groups.size):
            # What may ride in a round is gathered faster than gloo reduces it (docs/performance.md).
            rows = torch.empty((groups.size, flat.numel()), dtype=flat.dtype)
            work = all_gather_into(rows.view(-1), flat, groups.data, True)
            return _fused_parts(work, flat, tensors, divisor, postscale, (rows, sum_rows))
        work = dist.all_reduce(flat, op=torch_op, group=groups.data, async_op=True)
        return _fused_parts(work, flat, tensors, divisor, postscale)

    rides = as_bytes and payload_fits(nbytes, groups.size)
    return _Plan(
        context,
        groups,
        call,
        row_of(call),
        (dtype, device, op, prescale, postscale),
        issue_fused,
        # Reduced on the thread that settles the handle's ticket, with the reduced tensor itself (a value
        # already there: see collectives.ops._handle._Part).
        reduce_payloads(op, postscale) if rides else None,
        reduce_block_payloads(op, postscale) if rides else None,
        nbytes,
    )


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
    """Reduce ``tensor`` in place; ``blocking``: matched in order rather than by name."""
    context, groups = context_and_groups(process_set, what)
    device = tensor.device
    # The device and the shape (a torch.Size, a tuple) as they come: their type, index and a tuple of the
    # shape cost a burst's operation more than the rest of its key, and are made only for a new plan.
    key = (name, tensor.dtype, device, op, tensor.shape, prescale, postscale, groups.set_id)
    plan = _plans.get(key)
    if plan is None or plan.groups is not groups or plan.context is not context:
        if len(_plans) >= _PLANS_LIMIT:
            _plans.clear()
        facts = (name, tensor.dtype, device.type, op, tuple(tensor.shape))
        plan = _plans[key] = _plan(
            facts, prescale, postscale, context, groups, tensor.numel() * tensor.element_size(), device
        )

    # Made by tuple's own constructor: NamedTuple's and a class's __init__ are a Python call each.
    # Any: mypy does not see a tuple subclass's __call__ as making it callable.
    issue: Any = _new_tuple(_Issue, (tensor, op, prescale, postscale, plan, blocking))
    fusion = None
    if groups.size > 1 and tensor.is_contiguous():
        fusion = _new_tuple(
            Fusion, (plan.fusion_key, tensor, plan.issue_fused, plan.nbytes, plan.reduce, plan.reduce_block)
        )
    return _submit(plan.call, groups, issue, claim=not blocking, fusion=fusion, tensor=tensor, row=plan.row)


_new_tuple = tuple.__new__


class _Issue(tuple[torch.Tensor, ReduceOp, float, float, _Plan, bool]):
    """Starts one allreduce on its own, once agreed (when it fuses with nothing and does not ride): its
    tensor, op, prescale and postscale factors, plan, and whether its caller blocks.

    One object, not a closure: a closure over these facts is a function and seven cells, eight objects for
    the garbage collector to track per operation (see ``collectives.collector``).
    """

    __slots__ = ()

    def __call__(self, agreement: Agreement) -> _Part[torch.Tensor]:
        tensor, op, prescale, postscale, plan, blocking = self
        groups = plan.groups
        torch_op, divisor = _prescaled(tensor, op, prescale, plan.context, groups.size)
        if blocking:
            # Its caller waits for it at once (and runs the rounds itself): no Work round trip through Python.
            dist.all_reduce(tensor, op=torch_op, group=groups.data)
            return Handle([], lambda: _postscaled(tensor, divisor, postscale))
        work = dist.all_reduce(tensor, op=torch_op, group=groups.data, async_op=True)
        return Handle([work], lambda: _postscaled(tensor, divisor, postscale))


class _Fused:
    """One fused collective's buffer and its tensors: the first of its handles to be waited for waits for the
    collective and copies every tensor out of the buffer at once, so the others wait for nothing."""

    __slots__ = ("divisor", "flat", "gathered", "lock", "pending", "postscale", "tensors")

    def __init__(  # noqa: PLR0917 (one collective's facts)
        self,
        work: dist.Work,
        flat: torch.Tensor,
        tensors: list[torch.Tensor],
        divisor: int,
        postscale: float,
        gathered: _Rows | None,
    ) -> None:
        self.pending: list[dist.Work] = [work]  # emptied once the collective has been waited for
        self.gathered = gathered
        self.flat = flat
        self.tensors = tensors
        self.divisor = divisor
        self.postscale = postscale
        self.lock = threading.Lock()

    def finish(self) -> None:
        with self.lock:
            if self.pending:
                for work in self.pending:
                    _wait_work(work)
                if self.gathered is not None:
                    rows, sum_rows = self.gathered
                    sum_rows(self.flat, list(rows))
                unflatten_into(_postscaled(self.flat, self.divisor, self.postscale), self.tensors)
                self.pending.clear()

    def completed(self) -> bool:
        return not self.pending or all(work.is_completed() for work in self.pending)


class _FusedPart:
    """One tensor's share of a fused collective: what its handle's ticket is settled with."""

    __slots__ = ("fused", "index")

    def __init__(self, fused: _Fused, index: int) -> None:
        self.fused = fused
        self.index = index

    def wait(self) -> torch.Tensor:
        fused = self.fused
        if fused.pending:  # the first part waited for finishes them all (and empties `pending` last)
            fused.finish()
        return fused.tensors[self.index]

    def is_completed(self) -> bool:
        return self.fused.completed()


def _fused_parts(  # noqa: PLR0917 (one collective's facts)
    work: dist.Work,
    flat: torch.Tensor,
    tensors: list[torch.Tensor],
    divisor: int,
    postscale: float,
    gathered: _Rows | None = None,
) -> list[_Part[torch.Tensor]]:
    """One part per fused tensor, all of them on one :class:`_Fused` (``gathered``: every rank's buffer, to be
    summed into ``flat`` once the work is done, where the work is an all_gather)."""
    fused = _Fused(work, flat, tensors, divisor, postscale, gathered)
    return [_FusedPart(fused, i) for i in range(len(tensors))]


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
