"""How tensors are fused into flat buffers for collectives: one rule for every caller.

``grouped_allreduce`` and ``broadcast_parameters`` fuse everything of one dtype and device into one buffer;
``DistributedOptimizer`` cuts its gradients into buckets of about ``bucket_cap_mb``, the first one smaller,
as DDP does. One collective per buffer instead of one per tensor: latency, not bandwidth, dominates small
tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import torch

__all__ = ["assign_buckets", "fuse", "unflatten_into"]

TensorT = TypeVar("TensorT", bound=torch.Tensor)


def assign_buckets(
    tensors: Sequence[TensorT], cap_bytes: float = math.inf, first_cap_bytes: float | None = None
) -> list[list[TensorT]]:
    """``tensors`` grouped by (dtype, device), in the given order, and cut into buckets.

    A bucket closes as soon as it holds at least its limit (DDP's rule, so ``bucket_cap_mb`` means the same
    for both): ``first_cap_bytes`` for the first bucket of each dtype and device, ``cap_bytes`` after that.
    Buckets come in the order of their first tensor, so every rank that passes the same tensors gets the
    same buckets in the same order.
    """
    first_limit = cap_bytes if first_cap_bytes is None else min(first_cap_bytes, cap_bytes)
    buckets: list[list[TensorT]] = []
    open_buckets: dict[tuple[torch.dtype, torch.device], tuple[list[TensorT], int]] = {}
    closed_before: set[tuple[torch.dtype, torch.device]] = set()
    for tensor in tensors:
        key = (tensor.dtype, tensor.device)
        members, used = open_buckets.get(key, (None, 0))
        if members is None:
            members = []
            buckets.append(members)
        members.append(tensor)
        used += tensor.numel() * tensor.element_size()
        if used >= (cap_bytes if key in closed_before else first_limit):
            open_buckets.pop(key, None)
            closed_before.add(key)
        else:
            open_buckets[key] = (members, used)
    return buckets


def fuse(tensors: Sequence[torch.Tensor]) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """``tensors`` grouped by (dtype, device) in first-seen order, each group with a flat copy of it."""
    # One torch call per buffer, outside autograd: a reshape or a detach per tensor from Python costs more
    # than the copy for small tensors. (Of one tensor, flatten_dense_tensors gives a view: the buffer must
    # be a copy.)
    one_kind = len({(t.dtype, t.device) for t in tensors}) == 1  # the common case, without the byte counts
    with torch.no_grad():
        return [
            (members, _flat_copy(members))
            for members in ([list(tensors)] if one_kind else assign_buckets(tensors))
        ]


def _flat_copy(members: list[torch.Tensor]) -> torch.Tensor:
    if len(members) == 1:
        return members[0].reshape(-1).clone()
    if all(t.dim() == 1 for t in members):
        return torch.cat(members)  # a quarter of flatten_dense_tensors' time, which views every tensor
    return torch._C._nn.flatten_dense_tensors(members)


def unflatten_into(flat: torch.Tensor, members: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` back into ``members`` (the inverse of the concatenation)."""
    if not members:
        return
    targets = list(members)
    # Two calls for the whole buffer rather than a slice, a view and a copy per tensor; flat slices need no
    # view (unflatten_dense_tensors makes one per tensor). A set, not all() over a generator: a generator is
    # a Python call per tensor.
    if {t.dim() for t in targets} == {1}:
        parts = list(torch.split(flat, [t.numel() for t in targets]))
    else:
        parts = list(torch._C._nn.unflatten_dense_tensors(flat, targets))
    torch._foreach_copy_(targets, parts)
