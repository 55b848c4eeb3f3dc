"""The one wait on --elastic-timeout (launcher.job.slot_wait), on a simulated clock."""

from __future__ import annotations

from collections.abc import Iterator

from launcher.core.restart import GiveUp
from launcher.job.slot_wait import wait_for_slots

SHORT = "only 1 slot left, fewer than --min-np 2"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []
        self.said: list[str] = []

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> str | None:
        self.pauses.append(seconds)
        self.now += seconds
        return None

    def note(self, lines: list[str]) -> None:
        self.said.extend(lines)


def _wait(
    clock: Clock, answers: Iterator[str | GiveUp], *, polls: bool = False, timeout: float = 10.0
) -> object:
    return wait_for_slots(
        lambda: next(answers), timeout=timeout, polls=polls, note=clock.note, pause=clock.pause, clock=clock
    )


def test_enough_slots_at_the_first_look_need_no_wait() -> None:
    clock = Clock()
    assert _wait(clock, iter(["plan"])) == "plan"
    assert clock.pauses == [] and clock.said == []


def test_nothing_that_can_come_in_time_gives_up_at_once_with_the_first_looks_reason() -> None:
    clock = Clock()
    never = GiveUp(SHORT, below_min_np=True)
    assert _wait(clock, iter([never])) is never
    late = GiveUp(SHORT, below_min_np=True, back_at=clock.now + 11)
    assert _wait(clock, iter([late])) is late
    assert clock.pauses == [] and clock.said == []


def test_a_cooldown_ending_in_time_is_waited_for_and_said_once() -> None:
    clock = Clock()
    answers: Iterator[str | GiveUp] = iter(
        [GiveUp(SHORT, back_at=103.0), GiveUp(SHORT, back_at=106.0), "plan"]
    )
    assert _wait(clock, answers) == "plan"
    assert clock.pauses == [3.0, 3.0]
    assert clock.said == [f"{SHORT}: waiting up to 10s (--elastic-timeout) for a host's cooldown"]


def test_a_discovery_script_is_looked_at_each_poll_until_the_timeout() -> None:
    clock = Clock()
    answers: Iterator[str | GiveUp] = iter([GiveUp(SHORT)] * 20)
    given_up = _wait(clock, answers, polls=True, timeout=3.5)
    assert given_up == GiveUp(
        f"{SHORT}; not enough came back within --elastic-timeout 3.5s", below_min_np=True
    )
    assert clock.pauses == [1.0, 1.0, 1.0]
    assert clock.said == [f"{SHORT}: waiting up to 3.5s (--elastic-timeout) for the discovery script's hosts"]


def test_what_ends_a_pause_ends_the_wait() -> None:
    clock = Clock()
    ended = wait_for_slots(
        lambda: GiveUp(SHORT, back_at=clock.now + 1), timeout=10.0, polls=False, note=clock.note,
        pause=lambda seconds: "interrupted", clock=clock,
    )  # fmt: skip
    assert ended == "interrupted"


def test_the_callers_first_answer_is_not_looked_for_again() -> None:
    clock = Clock()
    looked: list[int] = []

    def look() -> str:
        looked.append(1)
        return "plan"

    found = wait_for_slots(
        look, timeout=10.0, polls=False, note=clock.note, pause=clock.pause, clock=clock,
        known=GiveUp(SHORT, back_at=101.0),
    )  # fmt: skip
    assert (found, looked, clock.pauses) == ("plan", [1], [1.0])
