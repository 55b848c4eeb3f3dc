"""The engine's side of a handle (:class:`Ticket`): what :mod:`collectives.engine` hands back for each entry
it is given, settled once the operation has been issued."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["Driver", "Lender", "Ticket", "Turn", "settle_all"]


class Driver(Protocol):
    """What a ticket and a turn need of their engine."""

    def drive(self, ticket: Ticket) -> None: ...

    @property
    def broken(self) -> BaseException | None: ...


class Lender(Protocol):
    """What a turn needs of its engine: to take the data group back."""

    def _release(self, turn: Turn) -> None: ...


_LOCK = threading.RLock()


class Ticket:
    """The engine's side of a handle: what starting the operation gave (or the error), once it has run.

    A driver settles its own ticket on its own thread, so the ticket holds no Event: one is made only for a
    caller that has to wait while another thread settles it (created on first need, under the lock). The
    lock is every ticket's: it is held for a few assignments, never across a call out, and a lock per ticket
    was one more object per operation for the garbage collector (``collectives.collector``). It is
    reentrant because an allocation under it may run the collector, and so a dropped handle's ``__del__``
    (which registers a callback on its own ticket) on the same thread.
    """

    __slots__ = ("_callbacks", "_done", "_engine", "_error", "_event", "_value")

    def __init__(self, engine: Driver | None = None) -> None:
        self._engine = engine
        self._done = False
        self._event: threading.Event | None = None
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] | None = None

    def done(self) -> bool:
        return self._done

    def result(self) -> Any:
        """Block until the operation has been issued, running the engine's rounds on this thread meanwhile
        (see ``collectives.engine.Engine.drive``); its start's value, or raise its error."""
        if not self._done:
            if self._engine is not None:
                self._engine.drive(self)
            if not self._done:
                with _LOCK:
                    if not self._done and self._event is None:
                        self._event = threading.Event()
                    event = self._event
                if event is not None:
                    event.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def failure(self) -> BaseException | None:
        """The engine's failure (a HorovodInternalError), if it has failed (a peer is gone) since: an
        operation already issued on NCCL may have been cut short by the abort that followed
        (``collectives.peer_loss``)."""
        return self._engine.broken if self._engine is not None else None

    def on_done(self, callback: Callable[[], None]) -> None:
        with _LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()

    def _settle(self, value: Any, error: BaseException | None) -> None:
        with _LOCK:
            if self._done:
                return
            self._value, self._error = value, error
            self._done = True
            event, self._event = self._event, None
            callbacks, self._callbacks = self._callbacks, None
        if event is not None:
            event.set()
        for callback in callbacks or ():
            callback()


def settle_all(tickets: Sequence[Ticket], values: Sequence[Any]) -> None:
    """Settle each of ``tickets`` with its value, as :meth:`Ticket._settle` does, under one hold of the lock:
    a round that reduces a burst settles all of its operations at once."""
    woken: list[tuple[threading.Event | None, list[Callable[[], None]] | None]] = []
    with _LOCK:
        for ticket, value in zip(tickets, values, strict=True):
            if ticket._done:
                continue
            ticket._value, ticket._error = value, None
            ticket._done = True
            event, callbacks = ticket._event, ticket._callbacks
            if event is not None or callbacks is not None:
                ticket._event = ticket._callbacks = None
                woken.append((event, callbacks))
    for event, callbacks in woken:
        if event is not None:
            event.set()
        for callback in callbacks or ():
            callback()


class Turn:
    """The data group lent to the caller's thread: granted once every rank has reached this ordered entry."""

    def __init__(self, ticket: Ticket, engine: Lender) -> None:
        self._ticket = ticket
        self._engine = engine
        self._released = False

    def granted(self) -> bool:
        return self._ticket.done()

    def wait(self) -> Any:
        """Block until granted, running the rounds on this thread; the agreement (``Agreement``; or the
        :class:`MismatchError`, which releases the turn)."""
        return self._ticket.result()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._engine._release(self)
