"""What the collectives hand back: a :class:`Handle` on an operation in flight, Horovod's ``poll`` and
``synchronize`` on it, and the agreement every collective reaches with its peers before it starts.

An operation that outlives its call holds its name until it is synchronized, as in Horovod, which refuses a
second operation of the same name meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch.distributed as dist

from collectives.errors import ArgumentError
from collectives.negotiation import Agreement, Call, negotiate
from collectives.registry import _Groups

__all__ = ["Handle", "poll", "synchronize"]

T = TypeVar("T")

# Names of async operations started and not yet synchronized: Horovod refuses a second one of the same name.
_in_flight: set[str] = set()


class Handle(Generic[T]):
    """An operation in flight; :meth:`wait` (or :func:`synchronize`) blocks until done, gives the result."""

    def __init__(self, works: Sequence[dist.Work], finish: Callable[[], T], name: str | None = None) -> None:
        self._works = list(works)
        self._finish = finish
        self._result: T | None = None
        self._done = False
        self._name = name

    def is_completed(self) -> bool:
        """Whether the communication has finished (wait() will then not block on the network)."""
        return self._done or all(work.is_completed() for work in self._works)

    def wait(self) -> T:
        """Block until the operation is complete and return its result; later calls return it again."""
        if not self._done:
            try:
                for work in self._works:
                    work.wait()
                self._result = self._finish()
                self._done = True
            finally:
                if self._name is not None:
                    _in_flight.discard(self._name)
        return self._result  # type: ignore[return-value]


def _claim(name: str | None) -> None:
    if name is None:
        return
    if name in _in_flight:
        raise ArgumentError(
            f"an operation named {name!r} is in flight already: synchronize it before reusing the name"
        )
    _in_flight.add(name)


def _agree(call: Call, groups: _Groups, *, claim: bool) -> Agreement:
    """Agree on ``call`` with every rank of ``groups`` (:func:`negotiate`); ``claim``: an operation that
    outlives this call (``_async``, grouped) holds its name until it is synchronized, and frees it again when
    the ranks disagree."""
    if claim:
        _claim(call.name)
    try:
        return negotiate(call, groups)
    except BaseException:
        if claim:
            _in_flight.discard(call.name or "")
        raise


def poll(handle: Handle[Any]) -> bool:
    """Whether the operation behind ``handle`` has finished (Horovod's ``hvd.poll``)."""
    return handle.is_completed()


def synchronize(handle: Handle[T] | Callable[[], T]) -> T:
    """Wait for ``handle`` and return the operation's result (Horovod's ``hvd.synchronize``)."""
    if isinstance(handle, Handle):
        return handle.wait()
    return handle()


def _combined(handles: Sequence[Handle[T]]) -> Handle[list[T]]:
    """One handle on several operations (the grouped collectives that run one operation per tensor)."""
    return Handle([w for h in handles for w in h._works], lambda: [h.wait() for h in handles])
