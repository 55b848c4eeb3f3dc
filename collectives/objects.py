"""Picklable Python objects across ranks: Horovod's ``broadcast_object`` and ``allgather_object``."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

from collectives.context import _require
from collectives.errors import ArgumentError
from collectives.negotiation import Call, Kind
from collectives.ops._handle import _turn
from collectives.process_sets import ProcessSet, global_process_set, groups_of

__all__ = ["allgather_object", "broadcast_object"]

T = TypeVar("T")


def broadcast_object(
    obj: T, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> T:
    """Return ``root_rank``'s picklable ``obj`` on every rank of the set (other ranks' ``obj`` is ignored)."""
    context = _require("broadcast_object")
    groups = groups_of(process_set, "broadcast_object")
    if root_rank not in groups.ranks:
        raise ArgumentError(f"broadcast_object: root_rank {root_rank} is not a rank of {process_set!r}")
    with _turn(Call(Kind.BROADCAST_OBJECT, name, root=root_rank), groups):
        if groups.size == 1:
            return obj
        box: list[Any] = [obj]
        device = torch.device("cuda", context.device_index) if context.device_index is not None else None
        dist.broadcast_object_list(box, src=root_rank, group=groups.data, device=device)
        return box[0]  # type: ignore[no-any-return]


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every rank's picklable ``obj``, as a list in rank order."""
    _require("allgather_object")
    groups = groups_of(process_set, "allgather_object")
    with _turn(Call(Kind.ALLGATHER_OBJECT, name), groups):
        if groups.size == 1:
            return [obj]
        out: list[Any] = [None] * groups.size
        dist.all_gather_object(out, obj, group=groups.data)
        return out
