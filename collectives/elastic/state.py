"""Horovod's elastic ``State`` and ``ObjectState``: what is committed, restored and synced from rank 0."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from collectives.errors import HostsUpdatedInterrupt

__all__ = ["HostUpdateResult", "ObjectState", "State"]


class HostUpdateResult:
    """Horovod's flags of what a host update did (combined with ``|``)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


def _broadcast(obj: Any) -> Any:
    from collectives.objects import broadcast_object

    return broadcast_object(obj, root_rank=0)


def _rank() -> int:
    from collectives.context import rank

    return rank()


class State:
    """State kept in every worker's memory across resets. ``bcast_object`` and ``get_rank`` default to
    collectives' own (Horovod's signature takes them first)."""

    def __init__(
        self, bcast_object: Callable[[Any], Any] = _broadcast, get_rank: Callable[[], int] = _rank
    ) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        # Horovod's private names, read by its integration test (elastic_torch_main.py --discovery-wait).
        self._host_messages: queue.Queue[tuple[float, int]] = queue.Queue()
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset, before the state is synced (e.g. scale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update: int) -> None:
        self._host_messages.put((timestamp, update))

    def commit(self) -> None:
        """Save the state in memory, then raise HostsUpdatedInterrupt if hosts were added or removed."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank at once when the agent reported a host change."""
        previous = newest = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
                update |= result
        # Rank 0's view decides, so that every rank raises at the same commit.
        previous, self._last_updated_timestamp, update = self._bcast_object((previous, newest, update))
        if self._last_updated_timestamp > previous:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Called after a reset, before the callbacks and the sync."""


class ObjectState(State):
    """Picklable Python objects, each keyword argument an attribute of the state."""

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = _broadcast,
        get_rank: Callable[[], int] = _rank,
        **kwargs: Any,
    ) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)
