"""The adaptive handshake window (launcher.backends.window), in-process with threads."""

from __future__ import annotations

import threading

from launcher.backends.window import Aborted, Ticket, Window


def test_window_halves_once_per_burst_of_drops_and_widens_slowly() -> None:
    window = Window(32)
    with window.slot() as first, window.slot() as second:
        assert first == Ticket(epoch=0, crowded=False) and second.crowded
    window.dropped(first)
    window.dropped(second)  # the same burst: started before the first halving
    assert window.size == 16
    with window.slot() as later:
        pass
    window.dropped(later)
    assert window.size == 8
    for _ in range(8):
        window.completed()
    assert 8.5 < window.size < 9.5  # about one more slot per window's worth of completions
    for _ in range(2000):
        window.completed()
    assert window.size == 32


def test_a_shrunk_window_holds_back_new_handshakes_until_one_ends() -> None:
    window = Window(2)
    window.dropped(Ticket(epoch=0, crowded=True))  # now 1
    entered = threading.Event()
    first_done = threading.Event()
    order: list[str] = []

    def second() -> None:
        with window.slot():
            order.append("second")

    with window.slot():
        thread = threading.Thread(target=second)
        thread.start()
        entered.set()
        thread.join(0.2)  # an event cannot show a thread *not* entering; this only bounds the wait
        assert thread.is_alive() and order == []
        order.append("first")
        first_done.set()
    thread.join(10)
    assert order == ["first", "second"]


def test_abort_wakes_hosts_waiting_for_a_slot() -> None:
    window = Window(1)
    outcome: list[str] = []

    def waiter() -> None:
        try:
            with window.slot():
                outcome.append("ran")
        except Aborted:
            outcome.append("aborted")

    with window.slot():
        thread = threading.Thread(target=waiter)
        thread.start()
        window.abort()
        thread.join(10)
    assert outcome == ["aborted"]
