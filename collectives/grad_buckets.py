"""The DistributedOptimizer's gradient buckets: a persistent buffer per run of same-dtype, same-device
parameters, filled slot by slot as gradients become final and reduced as one allreduce.

DDP's ``gradient_as_bucket_view``: where the buffer travels in the gradients' own dtype, the slots become the
gradients themselves after the first step, so the reduced buffer needs no copy back.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.compression import Compressor


def _views(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive slices of ``flat`` shaped like ``params``."""
    out: list[torch.Tensor] = []
    offset = 0
    for p in params:
        out.append(flat[offset : offset + p.numel()].view(p.shape))
        offset += p.numel()
    return out


class _NoWork:
    """The finished reduction of a rank that reduces with nobody (outside the optimizer's process set)."""

    def wait(self) -> bool:
        return True


class _Bucket:
    """A run of same-dtype, same-device parameters whose gradients are reduced as one flat buffer.

    The buffer is in the wire dtype and reused across steps; ``slots`` are views of it shaped like the
    parameters, so filling a slot is one pass that scales and casts at once.
    """

    def __init__(self, index: int, params: list[torch.nn.Parameter], compression: Any, divisor: int) -> None:
        self.index = index
        self.params = params
        # Multiplying by the reciprocal, as DDP does: a 0-d tensor operand costs a fraction of a Python
        # number's dispatch per parameter, and gives DDP's rounding (float64 only for float64 gradients).
        scale_dtype = torch.float64 if params[0].dtype == torch.float64 else torch.float32
        self.scale = None if divisor == 1 else torch.tensor(1.0 / divisor, dtype=scale_dtype)
        numel = sum(p.numel() for p in params)
        # A compressor of the user's own (Horovod's interface) is applied to the whole buffer at launch.
        self.custom = None if isinstance(compression, Compressor) else compression
        dtype = compression.wire_dtype_for(params[0].dtype) if self.custom is None else params[0].dtype
        # One element past the gradients: the count of joined ranks in a step that went out unagreed (see
        # collectives.step_agreement). It travels in every step, so the buffer's size is the same in all.
        self.buffer = torch.zeros(numel + 1, dtype=dtype, device=params[0].device)
        self.joined = self.buffer[numel:]
        # Gradients can live in the buffer itself when it travels in their own dtype.
        self.views = self.custom is None and dtype == params[0].dtype
        self.slots: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.slots.append(self.buffer[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()
        self.filled = [False] * len(params)
        self.missing = len(params)
        self.work: dist.Work | _NoWork | None = None
        self.wire: torch.Tensor = self.buffer
        self.ctx: Any = None

    def launch(self, group: Any, local: bool) -> None:
        if local:
            self.work = _NoWork()
            return
        if self.custom is not None:
            self.wire, self.ctx = self.custom.compress(self.buffer)
        self.work = dist.all_reduce(self.wire, op=dist.ReduceOp.SUM, group=group, async_op=True)

    def result(self) -> torch.Tensor:
        """The reduced buffer, decompressed by a custom compressor where there is one."""
        if self.custom is None:
            return self.buffer
        out: torch.Tensor = self.custom.decompress(self.wire, self.ctx)
        return out

    def fill(self, position: int, grad: torch.Tensor | None) -> None:
        """Put this rank's share of the reduction into the slot: the scaled gradient, zeros for none."""
        slot = self.slots[position]
        if grad is not None and grad.data_ptr() == slot.data_ptr() and grad.shape == slot.shape:
            # The gradient is this slot (a view from an earlier step): scale it where it lies.
            if self.scale is not None:
                slot.mul_(self.scale)
        elif grad is None:
            # No gradient on this rank in this step; the other ranks' buckets still hold the parameter.
            slot.zero_()
        elif self.scale is not None:
            # Scaled before the sum (and before the cast, as torch's fp16_compress_hook does): with
            # op=Average the sum on the wire is then the average itself, which overflows fp16 only if the
            # result would.
            torch.mul(grad, self.scale, out=slot)
        else:
            slot.copy_(grad)
        self.filled[position] = True
        self.missing -= 1

    def joined_count(self) -> int:
        """How many ranks took part as joined in the last reduction (their buckets marked ``joined``);
        the mark is cleared for the next one."""
        count = int(self.joined.item())
        if count:
            self.joined.zero_()
        return count

    def reset(self) -> None:
        self.filled = [False] * len(self.params)
        self.missing = len(self.params)
        self.work = None


def _grad_hook(owner_ref: weakref.ref[Any]) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook that forwards to the optimizer while it exists.

    The hook holds the optimizer weakly: a bound method would keep a dropped optimizer alive through the
    parameters, and its hooks would go on counting gradients (and, on several ranks, start allreduces that
    nothing waits for).
    """

    def hook(param: torch.Tensor) -> None:
        owner = owner_ref()
        if owner is not None:
            owner._on_grad_ready(param)

    return hook


def _remove_handles(handles: list[torch.utils.hooks.RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
