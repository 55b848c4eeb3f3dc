"""Allreduce: every rank gets the reduction (Average by default) of every rank's tensor."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from collectives.compression import Compression, Compressor
from collectives.engine_rounds import payload_fits
from collectives.engine_values import Fusion
from collectives.negotiation import Agreement, Call, Kind
from collectives.ops._common import _CARRIED, _needs_grad, _op_from, _postscaled, _prescaled
from collectives.ops._handle import Handle, _submit
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set
from collectives.reduce_op import ReduceOp

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_"]


# The requests seen lately, by their facts: a loop that reduces the same named tensors every step builds
# each one once (Horovod caches its responses per tensor name).
_calls: dict[tuple[Any, ...], Call] = {}
_CALLS_LIMIT = 4096


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
    facts = (name, tensor.dtype, device.type, op, tuple(tensor.shape))
    call = _calls.get(facts)
    if call is None:
        if len(_calls) >= _CALLS_LIMIT:
            _calls.clear()
        call = _calls[facts] = Call(Kind.ALLREDUCE, name, facts[1], facts[2], op, shape=facts[4])

    def issue(agreement: Agreement) -> Handle[torch.Tensor]:
        torch_op, divisor = _prescaled(tensor, op, prescale, context, groups.size)
        if blocking:
            # Its caller waits for it at once (and runs the rounds itself): no Work round trip through Python.
            dist.all_reduce(tensor, op=torch_op, group=groups.data)
            return Handle([], lambda: _postscaled(tensor, divisor, postscale))
        work = dist.all_reduce(tensor, op=torch_op, group=groups.data, async_op=True)
        return Handle([work], lambda: _postscaled(tensor, divisor, postscale))

    def issue_fused(tensors: list[torch.Tensor]) -> list[Handle[torch.Tensor]]:
        flat = torch._C._nn.flatten_dense_tensors(tensors)  # one call, not a view and a copy per tensor
        torch_op, divisor = _prescaled(flat, op, prescale, context, groups.size)
        work = dist.all_reduce(flat, op=torch_op, group=groups.data, async_op=True)
        return _fused_handles(work, flat, tensors, divisor, postscale)

    fusion = None
    if groups.size > 1 and tensor.is_contiguous():
        rides = (
            prescale == 1.0
            and device.type == "cpu"
            and tensor.dtype in _CARRIED
            and payload_fits(tensor.numel() * tensor.element_size(), groups.size)
        )
        fusion = Fusion(
            (facts[1], device, op, prescale, postscale),
            tensor,
            issue_fused,
            _reduce_payloads(tensor, op, postscale) if rides else None,
        )
    return _submit(call, groups, issue, claim=not blocking, fusion=fusion, tensor=tensor)


_COMBINE: dict[ReduceOp, Callable[..., torch.Tensor]] = {
    ReduceOp.SUM: torch.add,
    ReduceOp.AVERAGE: torch.add,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.PRODUCT: torch.mul,
}


def _reduce_payloads(
    tensor: torch.Tensor, op: ReduceOp, postscale: float
) -> Callable[[list[torch.Tensor]], Handle[torch.Tensor]]:
    """Reduce every rank's bytes of ``tensor`` into it, in set order: the same bits on every rank."""

    def reduce(payloads: list[torch.Tensor]) -> Handle[torch.Tensor]:
        parts = [p.view(tensor.dtype).view(tensor.shape) for p in payloads]
        combine = _COMBINE[op]
        combine(parts[0], parts[1], out=tensor)
        for part in parts[2:]:
            combine(tensor, part, out=tensor)
        divisor = len(parts) if op is ReduceOp.AVERAGE else 1
        return Handle([], lambda: _postscaled(tensor, divisor, postscale))

    return reduce


def _fused_handles(
    work: dist.Work, flat: torch.Tensor, tensors: list[torch.Tensor], divisor: int, postscale: float
) -> list[Handle[torch.Tensor]]:
    """One handle per fused tensor; the first to be waited for waits for the collective and copies every
    tensor out of the buffer at once, so the others wait for nothing."""
    pending = [work]  # shared: emptied once the collective has been waited for
    lock = threading.Lock()

    def finish_all() -> None:
        with lock:
            if pending:
                _postscaled(flat, divisor, postscale)
                parts = torch.split(flat, [t.numel() for t in tensors])
                # Fused tensors are contiguous (or they would not fuse): flat views of them take the parts.
                targets = tensors if all(t.dim() == 1 for t in tensors) else [t.view(-1) for t in tensors]
                torch._foreach_copy_(targets, list(parts))
                pending.clear()

    def finisher(i: int) -> Callable[[], torch.Tensor]:
        def finish() -> torch.Tensor:
            finish_all()
            return tensors[i]

        return finish

    return [Handle(pending, finisher(i)) for i in range(len(tensors))]


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
