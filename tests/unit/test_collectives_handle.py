"""Handles (collectives.ops._handle): what a ticket is settled with is the handle's part, and a tensor is
its own part, already there (an allreduce reduced in its round)."""

from __future__ import annotations

import torch

from collectives.engine_tickets import Ticket
from collectives.ops._handle import Handle, _in_flight, _Ready, _unreachable


def _settled(value: object) -> Ticket:
    ticket = Ticket()
    ticket._settle(value, None)
    return ticket


def test_a_tensor_settling_the_ticket_is_the_result_itself() -> None:
    tensor = torch.nn.Parameter(torch.ones(2))  # a subclass of Tensor counts as well
    handle: Handle[torch.Tensor] = Handle((), _unreachable, None, _settled(tensor))
    assert handle.is_completed()
    assert handle.wait() is tensor and handle.wait() is tensor


def test_another_part_is_waited_for_and_the_name_is_freed() -> None:
    values = [torch.zeros(1), torch.ones(1)]
    _in_flight.add("handle.test")
    handle: Handle[list[torch.Tensor]] = Handle((), _unreachable, "handle.test", _settled(_Ready(values)))
    assert handle.is_completed()
    assert handle.wait() is values
    assert "handle.test" not in _in_flight
