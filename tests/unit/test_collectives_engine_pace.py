"""The engine thread's waits between rounds (collectives.engine_pace): a cycle while work is left, an
idle wait that only grows otherwise."""

from __future__ import annotations

import pytest

from collectives.engine_pace import BURST_CYCLES, MAX_IDLE_WAIT_S, burst_deadline, next_waits

CYCLE = 0.001


@pytest.mark.parametrize(
    ("busy", "idle_wait", "expected"),
    [
        (True, CYCLE, (CYCLE, CYCLE)),
        # Busy after a long idle spell: the next round a cycle later, the idle wait kept.
        (True, MAX_IDLE_WAIT_S, (CYCLE, MAX_IDLE_WAIT_S)),
        (False, CYCLE, (2 * CYCLE, 2 * CYCLE)),
        (False, 0.8 * MAX_IDLE_WAIT_S, (MAX_IDLE_WAIT_S, MAX_IDLE_WAIT_S)),
        (False, MAX_IDLE_WAIT_S, (MAX_IDLE_WAIT_S, MAX_IDLE_WAIT_S)),
    ],
)
def test_the_next_wait_after_a_round(busy: bool, idle_wait: float, expected: tuple[float, float]) -> None:
    assert next_waits(busy, idle_wait, CYCLE) == pytest.approx(expected)


def test_a_step_a_round_keeps_the_thread_at_its_idle_wait() -> None:
    """An optimizer's step: one busy round (its agreement), then idle until the next step's wakes it. The
    waits in between never fall back to a cycle, where each would be a round every rank runs."""
    wait, idle = CYCLE, CYCLE
    idle_waits = []
    for _ in range(20):
        wait, idle = next_waits(True, idle, CYCLE)
        assert wait == CYCLE
        wait, idle = next_waits(False, idle, CYCLE)
        idle_waits.append(wait)
    assert idle_waits[-1] == MAX_IDLE_WAIT_S
    assert idle_waits == sorted(idle_waits)


def test_a_burst_starts_its_round_a_cycle_after_its_last_submission_or_at_its_cap() -> None:
    assert burst_deadline(10.0, 10.002, CYCLE) == pytest.approx(10.003)
    assert burst_deadline(10.0, 10.5, CYCLE) == pytest.approx(10.0 + BURST_CYCLES * CYCLE)
