"""The engine's round lock (collectives.engine_lock): a caller waits in line for it; the engine thread does
not, but marks its miss, and the next release wakes it at once rather than after its wait."""

from __future__ import annotations

import threading

from collectives.engine_lock import RoundLock
from tests.support import wait_until

LONG_S = 60.0  # the engine thread's wait when nobody wakes it: far longer than any join below


def test_a_free_lock_is_taken_and_nothing_is_marked() -> None:
    lock = RoundLock(threading.Condition())
    assert lock.try_acquire(LONG_S)
    assert not lock.missed
    lock.release()
    with lock:  # a caller
        pass
    assert lock.try_acquire(LONG_S)
    lock.release()


def test_the_engine_thread_marks_a_taken_lock_and_the_callers_release_wakes_it() -> None:
    cond = threading.Condition()
    lock = RoundLock(cond)
    got: list[bool] = []
    with lock:  # a caller's round
        thread = threading.Thread(target=lambda: got.append(lock.try_acquire(LONG_S)))
        thread.start()
        wait_until(lambda: lock.missed, what="the thread's mark", every=0.001)
    thread.join(LONG_S / 2)
    assert not thread.is_alive() and got == [False]
    assert not lock.missed
    assert lock.try_acquire(LONG_S)  # free now: the thread takes it the next time round
    lock.release()


def test_a_notice_on_the_condition_also_wakes_a_thread_that_missed_the_lock() -> None:
    cond = threading.Condition()
    lock = RoundLock(cond)
    got: list[bool] = []
    with lock:
        thread = threading.Thread(target=lambda: got.append(lock.try_acquire(LONG_S)))
        thread.start()
        wait_until(lambda: lock.missed, what="the thread's mark", every=0.001)
        with cond:  # new work submitted meanwhile
            cond.notify_all()
        thread.join(LONG_S / 2)
        assert not thread.is_alive() and got == [False]
        assert lock.missed  # still marked: the release will wake it again
    assert not lock.missed
