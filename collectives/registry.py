"""The process sets this rank knows of: the ``ProcessSet`` value, the groups behind each registered set, and
the table that ``collectives.init()`` and ``shutdown()`` fill and empty.

Below both the context and negotiation, which read the table, and ``collectives.process_sets``, which adds
and removes sets by negotiating with the other ranks: none of them has to import another to reach it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

__all__ = ["ProcessSet", "global_process_set"]


@dataclasses.dataclass(frozen=True)
class _Groups:
    """The torch.distributed side of a registered process set, as seen by this rank.

    The groups themselves are looked up by id rather than held: an exception's traceback keeps its frames'
    objects alive, and a held group would keep a shut-down job's rendezvous store alive with it, so that the
    next ``init()`` hangs.
    """

    set_id: int
    ranks: tuple[int, ...]
    # This rank's index in ``ranks``; None when it is not a member.
    index: int | None
    # len(ranks), as a field: every collective reads it, a property would cost each a Python call.
    size: int = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.ranks))

    @property
    def data(self) -> Any:
        """The data group; None for the global set (torch.distributed's default group)."""
        return _process_groups.get(self.set_id, (None, None))[0]

    @property
    def control(self) -> Any:
        """The set's second gloo group: the gradient channel of ``DistributedOptimizer``'s steps on the CPU
        (``collectives.step_agreement``). It carries nothing else, so that every rank's next collective on it
        is the same step's bucket."""
        return _process_groups.get(self.set_id, (None, None))[1]

    @property
    def engine(self) -> Any:
        """The gloo group on which the set's engine runs its agreement rounds (``collectives.engine``)."""
        groups = _process_groups.get(self.set_id, (None, None))
        return groups[2] if len(groups) > 2 else None


class ProcessSet:
    """A set of global ranks; usable in collectives once registered with :func:`add_process_set`.

    Mutable as Horovod's is: registration gives it a ``process_set_id`` and removal takes it back.
    """

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        self.ranks: list[int] | None = None if ranks is None else sorted({int(r) for r in ranks})
        self.process_set_id: int | None = None

    def _groups(self) -> _Groups | None:
        return None if self.process_set_id is None else _registered.get(self.process_set_id)

    def size(self) -> int | None:
        """Number of ranks in the set (None while it is not registered)."""
        groups = self._groups()
        return None if groups is None else groups.size

    def rank(self) -> int | None:
        """This process's rank within the set (None if it is not a member or the set is not registered)."""
        groups = self._groups()
        return None if groups is None else groups.index

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None while it is not registered)."""
        groups = self._groups()
        return None if groups is None else groups.index is not None

    def __repr__(self) -> str:
        ranks = "all" if self.ranks is None else self.ranks
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks})"


global_process_set = ProcessSet()

_registered: dict[int, _Groups] = {}
# Set id -> (data group, control group, engine group).
_process_groups: dict[int, tuple[Any, ...]] = {}
_next_id = [1]
# Called with the seconds to wait for the other ranks (None: as long as it takes, 0: not at all) before the
# groups go: the engines (a layer above) stop here.
_teardown_hooks: list[Callable[[float | None], None]] = []
# Called with the global set once registered: the engines (a layer above) start the global set's engine here.
_setup_hooks: list[Callable[[_Groups], None]] = []


def _setup(rank: int, size: int) -> None:
    """Register the global set; called by ``collectives.init()`` once the default group exists."""
    control = dist.new_group(backend="gloo") if size > 1 else None
    engine = dist.new_group(backend="gloo") if size > 1 else None
    _registered[0] = _Groups(0, tuple(range(size)), index=rank)
    _process_groups[0] = (None, control, engine)
    global_process_set.process_set_id = 0
    global_process_set.ranks = list(range(size))
    for hook in _setup_hooks:
        hook(_registered[0])


def _stop(wait_s: float | None) -> None:
    """Stop what runs on the sets' groups (the engines); called by ``collectives.shutdown()`` first."""
    for hook in _teardown_hooks:
        hook(wait_s)


def _teardown() -> None:
    """Forget every set; called by ``collectives.shutdown()`` before the default group goes."""
    _registered.clear()
    _process_groups.clear()
    _next_id[0] = 1
    global_process_set.process_set_id = None
