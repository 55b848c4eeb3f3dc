from __future__ import annotations

import re

import pytest

from launcher.core.hosts import Host
from launcher.core.plan import Plan, PlanInputs, build_plan, implicit_localhost, make_plan
from launcher.errors import PlanError

OVER = "; add --oversubscribe to place more ranks than slots"


def layout(plan: Plan) -> list[tuple[int, int, int, str]]:
    return [(s.rank, s.local_rank, s.node_rank, s.host.name) for s in plan.slots]


def test_default_uses_every_slot_in_order() -> None:
    plan = make_plan([Host("b", 2), Host("a", 3)], None)
    assert layout(plan) == [
        (0, 0, 0, "b"),
        (1, 1, 0, "b"),
        (2, 0, 1, "a"),
        (3, 1, 1, "a"),
        (4, 2, 1, "a"),
    ]
    assert plan.world_size == 5
    assert [h.name for h in plan.nodes] == ["b", "a"]
    assert plan.local_size(1) == 3


def test_fewer_processes_leave_last_hosts_out() -> None:
    plan = make_plan([Host("a", 2), Host("b", 2), Host("c", 2)], 3)
    assert layout(plan) == [(0, 0, 0, "a"), (1, 1, 0, "a"), (2, 0, 1, "b")]
    assert [h.name for h in plan.nodes] == ["a", "b"]
    assert plan.node_count == 2


def test_exact_slots() -> None:
    assert make_plan([Host("a", 4), Host("b", 4)], 8).world_size == 8


def test_oversubscription_spreads_round_robin_up_to_max_slots() -> None:
    plan = make_plan([Host("a", 2, max_slots=4), Host("b", 2, max_slots=3), Host("c", 1)], 8)
    assert [plan.local_size(n) for n in range(plan.node_count)] == [4, 3, 1]
    # Ranks stay contiguous per host even when oversubscribed.
    assert [s.host.name for s in plan.slots] == ["a"] * 4 + ["b"] * 3 + ["c"]
    assert [s.rank for s in plan.slots] == list(range(8))


def test_oversubscription_is_even() -> None:
    plan = make_plan([Host("a", 2, max_slots=10), Host("b", 2, max_slots=10)], 6)
    assert [plan.local_size(n) for n in range(plan.node_count)] == [3, 3]


def test_too_many_processes() -> None:
    with pytest.raises(PlanError) as info:
        make_plan([Host("a", 4), Host("b", 8)], 16)
    assert str(info.value) == f"requested 16 processes but the hosts provide 12 slots{OVER}"


def test_too_many_processes_mentions_max_slots() -> None:
    with pytest.raises(PlanError) as info:
        make_plan([Host("a", 4, max_slots=6), Host("b", 8)], 16)
    assert (
        str(info.value) == f"requested 16 processes but the hosts provide 12 slots (14 with max_slots){OVER}"
    )


def test_singular_slot() -> None:
    with pytest.raises(PlanError) as info:
        make_plan([Host("a")], 2)
    assert str(info.value) == f"requested 2 processes but the hosts provide 1 slot{OVER}"


@pytest.mark.parametrize("num_proc", [0, -1])
def test_non_positive(num_proc: int) -> None:
    with pytest.raises(PlanError, match="must be positive"):
        make_plan([Host("a", 2)], num_proc)


def test_no_hosts() -> None:
    with pytest.raises(PlanError, match="no hosts"):
        make_plan([], 1)


def test_oversubscribe_spreads_beyond_slots_evenly() -> None:
    plan = make_plan([Host("a", 2), Host("b", 2, max_slots=3)], 9, oversubscribe=True)
    assert [plan.local_size(n) for n in range(plan.node_count)] == [5, 4]


@pytest.mark.parametrize(
    ("hosts", "num_proc", "message"),
    [
        (
            [Host("a", 99999999999)],
            None,
            "requested 99999999999 processes on 1 host: distrun starts at most 1024",
        ),
        ([Host("a", 2)], 99999999999, "distrun starts at most 1024 per host"),
        ([Host("a", 1), Host("b", 2000, origin="-H 'b:2000'")], 1500, "-H 'b:2000': 1499 ranks on one host"),
    ],
)
def test_ranks_per_host_are_capped_even_when_oversubscribing(
    hosts: list[Host], num_proc: int | None, message: str
) -> None:
    with pytest.raises(PlanError, match=re.escape(message)):
        make_plan(hosts, num_proc, oversubscribe=True)


@pytest.mark.parametrize(
    ("num_proc", "cpus", "oversubscribe", "slots"),
    [(None, 2, False, 1), (4, 2, False, 4), (8, 2, False, 8), (9, 2, True, 9), (4, 1, False, 4)],
)
def test_implicit_localhost(num_proc: int | None, cpus: int, oversubscribe: bool, slots: int) -> None:
    host = implicit_localhost(num_proc, cpus, oversubscribe)
    assert (host.name, host.slots) == ("localhost", slots)


def test_implicit_localhost_is_bounded_by_cores() -> None:
    with pytest.raises(PlanError, match=r"-np 1000: this machine has 2 CPU cores .* at most 8 ranks here"):
        implicit_localhost(1000, 2, False)


def test_plan_inputs_keep_oversubscription_through_a_resize() -> None:
    inputs = PlanInputs((Host("a", 2),), 3, oversubscribe=True)
    assert build_plan(inputs).world_size == 3
    resized = inputs.resized([Host("b", 1)], 2)
    assert resized == PlanInputs((Host("b", 1),), 2, oversubscribe=True)
    assert [s.host.name for s in build_plan(resized).slots] == ["b", "b"]
