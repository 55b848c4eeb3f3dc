"""A process set's round lock (``collectives.engine``): held for each round and the issue that follows it,
by the engine thread or by a caller that drives, so that one process's rounds come one at a time (rounds
pair up across ranks by their count, whichever thread runs them).

A caller waits in line for it; the engine thread does not. In line, the thread took the lock as soon as a
caller's round freed it, then waited for the interpreter while that caller submitted its next burst, and
ran that burst's round itself while the caller waited for the lock: without the burst's block, which rides
only in a round a waiting caller runs (``collectives.engine_announce``), so half of a run of bursts went by a
collective. Finding the lock taken, the thread marks its miss and waits on the engine's condition, and the
next release wakes it: work that only its rounds move on (an operation some rank has not yet submitted, one
agreed behind a turn) does not wait out an idle wait.
"""

from __future__ import annotations

import threading

__all__ = ["RoundLock"]


class RoundLock:
    """The round lock, and whether the engine thread found it taken since its last release."""

    def __init__(self, cond: threading.Condition) -> None:
        self._lock = threading.Lock()
        self._cond = cond  # the engine's condition, on which its thread alone waits
        self.missed = False

    def __enter__(self) -> None:
        """Wait in line for the lock (a caller that drives)."""
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def try_acquire(self, wait_s: float) -> bool:
        """Take the lock if it is free (the engine thread); else mark the miss and wait, at most ``wait_s``,
        for its release or anything else that notifies the condition, and say so."""
        if self._lock.acquire(blocking=False):
            return True
        with self._cond:
            if self._lock.locked():
                self.missed = True
                self._cond.wait(wait_s)
        return False

    def release(self) -> None:
        """Free the lock, and wake the engine thread if it found it taken meanwhile."""
        self._lock.release()
        with self._cond:
            if self.missed:
                self.missed = False
                self._cond.notify_all()
