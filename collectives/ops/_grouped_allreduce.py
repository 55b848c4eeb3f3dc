"""Grouped allreduce: many tensors reduced as one operation, fused into a flat buffer per dtype and device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.buckets import fuse, unflatten_into
from collectives.compression import Compression, Compressor
from collectives.engine_announce import payload_fits
from collectives.engine_values import Fusion
from collectives.negotiation import Agreement, Call, Kind, dtype_code, shape_digest
from collectives.ops._common import (
    _needs_grad,
    _op_from,
    _postscaled,
    _prescaled,
    carried,
    reduce_block_payloads,
)
from collectives.ops._handle import Handle, _Part, _Ready, _submit
from collectives.process_sets import ProcessSet, context_and_groups, global_process_set
from collectives.reduce_op import ReduceOp

__all__ = [
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
]


def fused_buffers_shape(buffers: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The fused buffers as (dtype code, length) pairs: what a joined rank needs to take part with zeros."""
    if len(buffers) > 8:
        return ()
    return tuple(v for flat in buffers for v in (dtype_code(flat.dtype), flat.numel()))


def _fuses_with_nothing(tensors: list[torch.Tensor]) -> list[Any]:
    raise AssertionError("a grouped allreduce's fusion key is its own: it fuses with nothing")


def _riding(
    flat: torch.Tensor,
    members: list[torch.Tensor],
    targets: list[torch.Tensor],
    op: ReduceOp,
    postscale: float,
) -> Fusion:
    """A grouped call of one small CPU buffer rides in its agreement round, as a small allreduce does:
    reduced from every rank's bytes, with no collective of its own.

    Reduced as a block of riding allreduces is, into a buffer and views kept while the members' shapes hold
    (``flat`` only carries this rank's bytes): cutting the buffer into a view per tensor in every call was
    most of a call's reduction of 64 small tensors."""
    reduce_block = reduce_block_payloads(op, postscale)

    def reduce(tensor: torch.Tensor, payloads: list[torch.Tensor]) -> _Part[list[torch.Tensor]]:
        reduce_block(members, payloads)
        return _Ready(targets)

    return Fusion(object(), flat, _fuses_with_nothing, flat.nbytes, reduce)


def _grouped_allreduce_start(  # noqa: PLR0917 (Horovod's signature)
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    name: str | None,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    what: str,
    blocking: bool = False,
) -> Handle[list[torch.Tensor]]:
    """Reduce ``tensors`` in place, fused into one flat buffer per dtype and device; ``blocking``: matched in
    order rather than by name, its rounds run by the caller (as a blocking allreduce's)."""
    context, groups = context_and_groups(process_set, what)
    targets = list(tensors)
    fused = fuse(targets) if targets else []
    device = targets[0].device.type if targets else "cpu"
    call = Call(
        Kind.GROUPED_ALLREDUCE,
        name,
        device=device,
        op=op,
        shape=fused_buffers_shape([flat for _, flat in fused]),
        digest=shape_digest(targets),
    )

    def issue(agreement: Agreement) -> Handle[list[torch.Tensor]]:
        works: list[dist.Work] = []
        divisors: list[int] = []
        for _, flat in fused:
            torch_op, divisor = _prescaled(flat, op, prescale, context, groups.size)
            works.append(dist.all_reduce(flat, op=torch_op, group=groups.data, async_op=True))
            divisors.append(divisor)

        def result() -> list[torch.Tensor]:
            for (members, flat), divisor in zip(fused, divisors, strict=True):
                unflatten_into(_postscaled(flat, divisor, postscale), members)
            return targets

        return Handle(works, result)

    fusion = None
    if len(fused) == 1 and groups.size > 1:
        members, flat = fused[0]
        if carried(prescale, device, flat.dtype) and payload_fits(flat.nbytes, groups.size):
            fusion = _riding(flat, members, targets, op, postscale)
    return _submit(
        call, groups, issue, claim=not blocking, fusion=fusion, tensor=targets[0] if targets else None
    )


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
    return _grouped_allreduce_start(
        tensors,
        _op_from(average, op),
        name,
        prescale_factor,
        postscale_factor,
        process_set,
        "grouped_allreduce_",
        blocking=True,
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
                copies, op, name, prescale, postscale, process_set, "grouped_allreduce", blocking=True
            ).wait()
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.args
        copies = [g.detach().clone() for g in grads]
        reduced = _grouped_allreduce_start(
            copies, op, None, prescale, postscale, process_set, "grouped_allreduce", blocking=True
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
            blocking=True,
        ).wait()
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed, strict=True)]
