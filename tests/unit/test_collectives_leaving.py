"""How long a rank waits for its peers when its interpreter exits (collectives.leaving)."""

from __future__ import annotations

import os
import sys

import pytest

from collectives import leaving


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []
    monkeypatch.setattr(leaving, "_registered_in", os.getpid())
    monkeypatch.setattr(leaving, "_exit_status", None)
    monkeypatch.delattr(sys, "last_value", raising=False)
    return waits


@pytest.mark.parametrize(
    ("status", "uncaught", "expected"),
    [
        (None, False, leaving.EXIT_WAIT_S),  # fell off the end of the script
        (0, False, leaving.EXIT_WAIT_S),  # sys.exit(0)
        (3, False, 0.0),  # sys.exit(3): its peers may be waiting for it in a collective
        ("bad input", False, 0.0),  # sys.exit("message") exits 1
        (None, True, 0.0),  # an uncaught exception
    ],
)
def test_exit_waits_for_peers_only_when_the_rank_ends_well(
    registered: list[float],
    monkeypatch: pytest.MonkeyPatch,
    status: str | int | None,
    uncaught: bool,
    expected: float,
) -> None:
    monkeypatch.setattr(leaving, "_exit_status", status)
    if uncaught:
        monkeypatch.setattr(sys, "last_value", RuntimeError("boom"), raising=False)
    leaving._at_exit(registered.append)
    assert registered == [expected]


def test_a_forked_child_does_not_leave_its_parents_group(
    registered: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leaving, "_registered_in", os.getpid() + 1)
    leaving._at_exit(registered.append)
    assert registered == []


def test_sys_exit_is_recorded_and_still_exits(registered: list[float]) -> None:
    with pytest.raises(SystemExit) as raised:
        leaving._recording_exit(5)
    assert raised.value.code == 5
    assert leaving._exit_status == 5
