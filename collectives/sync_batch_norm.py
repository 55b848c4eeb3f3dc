"""Horovod's ``hvd.SyncBatchNorm``: batch statistics over every rank, as torch's own ``SyncBatchNorm``.

torch's module computes them with collectives on the default group; this one takes Horovod's arguments and
runs on this library's process group. torch's module needs CUDA inputs, as Horovod's does for its tests.
"""

from __future__ import annotations

import torch

from collectives.context import _require

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """Applies synchronous batch normalization over every rank (Horovod's signature)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        _require("SyncBatchNorm")
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
