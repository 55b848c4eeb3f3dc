"""Averaging of scalar metrics (loss, accuracy, ...) across ranks, for logging one number per job."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from collectives.errors import CollectivesError, MetricKeysMismatchError
from collectives.reduce_op import ReduceOp

if TYPE_CHECKING:
    import torch

__all__ = ["average_metrics", "reduce_metrics"]


def reduce_metrics(
    metrics: Mapping[str, float | int | torch.Tensor], op: ReduceOp = ReduceOp.AVERAGE
) -> dict[str, float]:
    """Reduce each scalar metric across ranks with one collective; every rank gets the result.

    All ranks must pass the same names; a mismatch raises :class:`MetricKeysMismatchError` on every rank
    instead of silently mixing different metrics.
    """
    import torch

    from collectives import context
    from collectives.ops import allgather, allreduce_
    from collectives.ops._common import _comm_device

    ctx = context._require("reduce_metrics")
    names = sorted(metrics)
    values: list[float] = []
    for name in names:
        value = metrics[name]
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise CollectivesError(f"metric {name!r} must be a scalar, got shape {tuple(value.shape)}")
            value = value.item()
        values.append(float(value))
    device = _comm_device(ctx)
    # Names first, via a fixed-size header, so that a mismatch is an error on every rank rather than a hang
    # (different lengths) or a silent mix (same length, different names).
    signature = float(zlib.crc32("\0".join(names).encode()))
    header = torch.tensor([[float(len(names)), signature]], dtype=torch.float64, device=device)
    headers = allgather(header).cpu()
    if not bool((headers == headers[0]).all()):
        raise MetricKeysMismatchError(
            f"ranks passed different metric names to average_metrics (this rank: {names}); "
            "every rank must report the same metrics"
        )
    reduced = allreduce_(torch.tensor(values, dtype=torch.float64, device=device), op)
    return dict(zip(names, (float(v) for v in reduced.cpu()), strict=True))


def average_metrics(metrics: Mapping[str, float | int | torch.Tensor]) -> dict[str, float]:
    """The mean of each scalar metric over all ranks (Horovod's metric-average callback)."""
    return reduce_metrics(metrics, ReduceOp.AVERAGE)
