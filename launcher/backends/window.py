"""How many SSH handshakes may be in flight at once: a window that adapts as TCP's congestion window does."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass


class Aborted(Exception):
    """Another host failed first, so this one was not (or no longer) tried."""


@dataclass(frozen=True)
class Ticket:
    """One handshake's place in the window: the congestion epoch it started in, and whether it had company."""

    epoch: int
    crowded: bool


class Window:
    """How many handshakes may be in flight at once (pdsh's fan-out), adapting as TCP's congestion window.

    It opens at `limit`. A dropped handshake halves it: sshd's MaxStartups answers a burst of handshakes by
    closing some of them at random, and retries that arrive as one burst again are dropped again, while fewer
    at a time get through. All drops among handshakes started before the last halving are one congestion
    event and halve it once. Each completed handshake widens it by 1/size (by one per window's worth of
    completions), up to `limit`. A host waiting for a slot is not timing out yet: each attempt's timeout
    starts with its handshake, so the time a launch may take grows with the host count by itself. `abort()`
    wakes every waiter: once one host failed, nothing new starts.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.size = float(self.limit)
        self.in_flight = 0
        self.epoch = 0
        self.aborted = threading.Event()
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def slot(self) -> Iterator[Ticket]:
        with self._cond:
            while self.in_flight >= int(self.size) and not self.aborted.is_set():
                self._cond.wait()
            if self.aborted.is_set():
                raise Aborted
            self.in_flight += 1
            ticket = Ticket(self.epoch, crowded=self.in_flight > 1)
        try:
            yield ticket
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def dropped(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket.epoch == self.epoch:
                self.size = max(1.0, self.size / 2)
                self.epoch += 1

    def completed(self) -> None:
        with self._cond:
            self.size = min(float(self.limit), self.size + 1 / self.size)
            self._cond.notify_all()

    def abort(self) -> None:
        self.aborted.set()
        with self._cond:
            self._cond.notify_all()
