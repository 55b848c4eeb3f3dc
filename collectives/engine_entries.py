"""What a process set's engine (``collectives.engine``) holds per operation: the :class:`Entry` a submission
makes, which is also the ticket its handle waits on (the engine keeps it until the operation is issued), and
an agreed operation's item in the issue queue (:data:`Agreed`), made once per response-cache slot for
operations agreed by their bit (:func:`cached_items`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from collectives.engine_announce import Announcement
from collectives.engine_cache import ResponseCache
from collectives.engine_rounds import Riders
from collectives.engine_tickets import Driver, Ticket
from collectives.engine_values import Fusion
from collectives.negotiation import Agreement, Call, row_of

__all__ = ["Agreed", "Entry", "cached_items"]

# An agreed operation, in issue order: its key, every rank's row, every rank's payload (or None), and the
# agreement where the response cache knows it already (None: the verdict is made from the rows). Or a run
# of cached operations whose bytes rode in their round (0, no rows, the riders, None).
Agreed = tuple[int, list[list[int]], list[torch.Tensor] | Riders | None, Agreement | None]


class Entry(Ticket):
    """One submitted operation, and its own ticket: its key and call, how to start it once agreed, and what
    the round and the issue need of it (fusion, whether it lends the data group, CUDA event, row).

    The entry is the ticket its handle holds, not an object beside it: one object an operation fewer, and
    the engine's round only lets go of it, while the handle's owner frees it (and the start and fusion it
    holds) once done with the handle. Freeing a round's entries in the round was the largest part of its
    agreement's work (docs/performance.md)."""

    __slots__ = (
        "call",
        "cuda_event",
        "device",
        "driven",
        "fusion",
        "key",
        "label",
        "lends",
        "row",
        "seq",
        "start",
    )

    def __init__(  # noqa: PLR0917 (the facts of one submission)
        self,
        engine: Driver | None,
        key: int,
        call: Call,
        label: str,
        start: Callable[[Agreement], Any] | None,
        fusion: Fusion | None = None,
        lends: bool = False,
        cuda_event: Any = None,
        device: int | None = None,
        driven: bool = False,
        row: list[int] | None = None,
        seq: int = 0,  # this rank's count of submissions (collectives.progress); 0: a stand-in's
    ) -> None:
        # Ticket's fields, set here: calling Ticket.__init__ would cost every operation a Python call.
        self._engine = engine
        self._done = False
        self._event = None
        self._value = None
        self._error = None
        self._callbacks = None
        self.key = key
        self.call = call
        self.label = label
        self.start = start
        self.fusion = fusion
        self.lends = lends  # a turn: once agreed, the data group is the caller's until released
        self.cuda_event = cuda_event
        self.device = device
        self.driven = driven
        self.row = row
        self.seq = seq

    def announced_row(self) -> list[int]:
        row = self.row
        if row is None:
            row = self.row = row_of(self.call)
        return row

    def announcement(self) -> Announcement:
        fusion = self.fusion
        payload = fusion.tensor if fusion is not None and fusion.reduce is not None else None
        row = self.row
        return Announcement(self.key, row_of(self.call) if row is None else row, self.label, payload)


def cached_items(items: list[Agreed], cache: ResponseCache) -> list[Agreed]:
    """``items`` (the queue item of each slot of ``cache``, by slot), grown by the slots admitted since the
    last call. An operation agreed by its bit is queued as its slot's item: the same tuple every step, so a
    step of cached operations allocates nothing per operation for the garbage collector to track."""
    for slot in range(len(items), len(cache.keys)):
        agreement = Agreement(cache.all_rows[slot], ())
        items.append((cache.keys[slot], agreement.rows, None, agreement))
    return items
