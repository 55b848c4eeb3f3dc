"""Tickets (collectives.engine_tickets): ``settle_all`` settles a burst's tickets as ``_settle`` settles one:
values in order, a ticket settled already left as it was, a waiting thread woken, callbacks run once."""

from __future__ import annotations

import threading

import pytest

from collectives.engine_tickets import Ticket, settle_all

LONG_S = 60.0


def test_every_ticket_gets_its_own_value_and_a_settled_one_keeps_its_own() -> None:
    tickets = [Ticket() for _ in range(4)]
    tickets[2]._settle("earlier", None)
    settle_all(tickets, ["a", "b", "c", "d"])
    assert [t.done() for t in tickets] == [True] * 4
    assert [t.result() for t in tickets] == ["a", "b", "earlier", "d"]


def test_a_failed_ticket_is_not_turned_into_a_success() -> None:
    failed = Ticket()
    failed._settle(None, RuntimeError("gone"))
    settle_all([failed], ["value"])
    with pytest.raises(RuntimeError, match="gone"):
        failed.result()


def test_a_thread_waiting_on_a_ticket_wakes_and_its_callbacks_run_once() -> None:
    ticket = Ticket()  # no engine: result() waits on the ticket's event
    calls: list[str] = []
    ticket.on_done(lambda: calls.append("done"))
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(ticket.result()))
    waiter.start()
    settle_all([Ticket(), ticket], [None, "value"])
    waiter.join(LONG_S)
    assert not waiter.is_alive() and got == ["value"]
    settle_all([ticket], ["again"])
    assert calls == ["done"] and ticket.result() == "value"
    ticket.on_done(lambda: calls.append("late"))  # settled: runs at once
    assert calls == ["done", "late"]


def test_tickets_and_values_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        settle_all([Ticket(), Ticket()], ["only one"])
