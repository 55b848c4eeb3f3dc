"""Horovod's process sets on torch.distributed subgroups.

A process set is a subset of the ranks that runs collectives of its own (``process_set=`` on every
collective). Each registered set owns three torch.distributed groups: the data group (the job's backend)
that carries tensors, a gloo group for ``DistributedOptimizer``'s gradient buckets on the CPU (the
``control`` group, ``collectives.step_agreement``), and a gloo group for its engine's agreement rounds, in
which the ranks agree on each collective before it starts (``collectives.negotiation``). Keeping the rounds
apart from data means a rank whose data collective is still in flight cannot be paired with another rank's
agreement.

Creating and removing a set is collective over the whole job, as in Horovod: torch.distributed requires
every rank to create every group, member or not. The ranks agree on it in the global set's ordered
sequence, as on every collective, so a rank that is elsewhere makes all of them raise instead of hang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch.distributed as dist

from collectives import context as _context_module
from collectives import links
from collectives.context import _Context, _require
from collectives.engines import engine_for, stop_engine
from collectives.errors import ArgumentError, CollectivesError
from collectives.registry import (
    ProcessSet,
    _Groups,
    _next_id,
    _process_groups,
    _registered,
    global_process_set,
)

if TYPE_CHECKING:
    from collectives.negotiation import Call

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


def context_and_groups(process_set: ProcessSet, what: str) -> tuple[_Context, _Groups]:
    """The initialised context and the registered groups of ``process_set``; this rank must be a member.

    Both at once because every collective starts with both: one call on the hot path, not three (the context's
    and the set's own lookups are read here directly).
    """
    context = _context_module._context or _require(what)  # _require raises: not initialised
    set_id = process_set.process_set_id
    groups = None if set_id is None else _registered.get(set_id)
    if groups is None:
        raise CollectivesError(
            f"{what}: {process_set!r} is not registered; call collectives.add_process_set() first"
        )
    if groups.index is None:
        raise CollectivesError(f"{what}: this rank is not a member of {process_set!r}")
    return context, groups


def groups_of(process_set: ProcessSet, what: str) -> _Groups:
    """The registered groups of ``process_set``; this rank must be a member."""
    return context_and_groups(process_set, what)[1]


def _agree_in_order(call: Call) -> None:
    """Agree on ``call`` in the job's ordered sequence, where every other collective is agreed: a rank that
    is elsewhere (in a barrier, a collective) makes every rank raise :class:`MismatchError`, where an
    exchange of its own would leave this rank waiting on one channel and the other on another."""
    groups = _registered[0]
    if groups.size > 1:
        engine_for(groups).agree(call).result()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set; every rank of the job must call it with the same ranks, in the same order."""
    from collectives.negotiation import Call, Kind

    context = _require("add_process_set")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None or not ps.ranks:
        raise ArgumentError("add_process_set needs a non-empty list of ranks")
    size = context.topology.size
    if ps.ranks[0] < 0 or ps.ranks[-1] >= size:
        raise ArgumentError(f"process set ranks {ps.ranks} must lie in [0, {size})")
    if ps.process_set_id is not None:
        raise ArgumentError(f"{ps!r} is registered already")
    same = [i for i, g in _registered.items() if list(g.ranks) == ps.ranks]
    _agree_in_order(Call(Kind.ADD_PROCESS_SET, shape=tuple(ps.ranks)))
    if same:
        raise ArgumentError(f"a process set with ranks {ps.ranks} is registered already (id {same[0]})")
    with links.owned():
        data = dist.new_group(ps.ranks) if size > 1 else None
        control = dist.new_group(ps.ranks, backend="gloo") if size > 1 else None
        engine = dist.new_group(ps.ranks, backend="gloo") if size > 1 else None
    me = context.topology.rank
    set_id = _next_id[0]
    _next_id[0] += 1
    _registered[set_id] = _Groups(
        set_id, tuple(ps.ranks), index=ps.ranks.index(me) if me in ps.ranks else None
    )
    _process_groups[set_id] = (data, control, engine)
    ps.process_set_id = set_id
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set added by :func:`add_process_set` (all ranks together); False if it was not one."""
    from collectives.negotiation import Call, Kind

    _require("remove_process_set")
    set_id = process_set.process_set_id
    _agree_in_order(Call(Kind.REMOVE_PROCESS_SET, shape=(-1 if set_id is None else set_id,)))
    if set_id is None or set_id == 0 or set_id not in _registered:
        return False
    if _registered[set_id].index is not None:
        stop_engine(set_id)
    groups = _registered.pop(set_id)
    for group in _process_groups.pop(set_id, (None, None)):
        if group is not None and groups.index is not None:
            dist.destroy_process_group(group)
    process_set.process_set_id = None
    return True
