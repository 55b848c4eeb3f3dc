"""Gradient compression, with Horovod's compressor interface: ``compress(t) -> (wire, ctx)``,
``decompress(wire, ctx) -> t``.

The built-in compressors cast floating tensors to a 16-bit type for the wire and back afterwards; a user's
own compressor (any object with Horovod's two methods) works wherever ``compression=`` is accepted.

Tolerance (documented in docs/collectives.md and checked by the integration tests): in norm, the averaged
gradient differs from the uncompressed one by at most ``size * u`` relative, where u is the wire dtype's unit
roundoff (2**-11 for fp16, 2**-8 for bf16): one rounding for the cast plus one per addition of the sum.
fp16 keeps more mantissa bits; bf16 keeps fp32's range, so it cannot overflow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["Compression", "Compressor"]


@dataclasses.dataclass(frozen=True)
class Compressor:
    """Casts floating tensors to ``wire_dtype`` (None: no compression) for communication."""

    name: str
    wire_dtype: torch.dtype | None

    def wire_dtype_for(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype in which a tensor of ``dtype`` travels: ``wire_dtype`` for floating types."""
        return self.wire_dtype if self.wire_dtype is not None and dtype.is_floating_point else dtype

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send (``tensor`` itself, or a cast copy) and the context ``decompress`` needs."""
        return tensor.to(self.wire_dtype_for(tensor.dtype)), tensor.dtype

    def decompress(self, wire: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor in the original dtype (``ctx``, as returned by :meth:`compress`)."""
        if ctx is None or wire.dtype == ctx:
            return wire
        return wire.to(ctx)


class Compression:
    """The available compressors, named as in Horovod: ``Compression.none``, ``.fp16``; ``.bf16`` is ours."""

    none = Compressor("none", None)
    fp16 = Compressor("fp16", torch.float16)
    bf16 = Compressor("bf16", torch.bfloat16)
