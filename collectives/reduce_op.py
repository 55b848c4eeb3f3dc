"""Reduction operations, Horovod-style (``collectives.Average``, ``collectives.Sum``, ...).

Kept free of torch so that ``import collectives`` stays cheap for the launcher.
"""

from __future__ import annotations

import enum

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum"]


class ReduceOp(enum.Enum):
    """How allreduce-like collectives combine the ranks' tensors."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    # Named so that Horovod scripts import; every collective refuses it (see collectives.features).
    ADASUM = "adasum"

    # Members are singletons compared by identity: hashed by it too, in C, where Enum's own __hash__ is a
    # Python call for every collective that looks up its cached plan by its op.
    __hash__ = object.__hash__


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM
