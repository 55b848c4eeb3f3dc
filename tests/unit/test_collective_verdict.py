"""The verdict from the ranks' collective records (launcher.diagnose.collective_verdict), table-tested, and
how `distrun stacks` prints them beside each group."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.diagnose.collective_verdict import (
    Op,
    RankProgress,
    collective_verdict,
    progress_line,
    records_of,
)
from launcher.diagnose.stacks import Frame, RankStacks, StackDump


def rec(rank: int, issued: int, done: int, name: str = "grad.w", process_set: int = 0) -> RankProgress:
    return RankProgress(
        rank,
        process_set,
        issued=Op(issued, "allreduce", name if issued > done else "grad.prev") if issued else None,
        done=Op(done, "allreduce", "grad.prev") if done else None,
    )


def moving(record: RankProgress) -> RankProgress:
    return dataclasses.replace(record, moving=True)


CASES = [
    pytest.param(
        {**{r: [rec(r, 1043, 1042, "grad.layer4.weight")] for r in range(7)}, 7: [rec(7, 1042, 1042)]},
        8,
        "ranks 0-6 wait in allreduce `grad.layer4.weight` (#1043, process set 0); rank 7 never issued it: "
        "its last completed is #1042; rank 7's stack: data_loader, train.py:88",
        id="one-rank-behind",
    ),
    pytest.param(
        {1: [rec(1, 1, 0, "only_me")], 0: [RankProgress(0)]},
        2,
        "rank 1 waits in allreduce `only_me` (#1, process set 0); rank 0 never issued it: it has issued no "
        "collective since init()",
        id="nothing-since-init",
    ),
    pytest.param(
        {0: [rec(0, 5, 4, "x")], 1: [rec(1, 5, 4, "x")]},
        3,
        "ranks 0-1 wait in allreduce `x` (#5, process set 0); rank 2 never issued it: it keeps no record of "
        "its collectives (not using collectives, or not initialised)",
        id="rank-without-records",
    ),
    pytest.param(
        {0: [rec(0, 5, 4, "x")], 1: [rec(1, 5, 4, "x")]},
        2,
        "ranks 0-1 wait in allreduce `x` (#5, process set 0); every rank issued it",
        id="all-issued",
    ),
    pytest.param({0: [rec(0, 5, 5)], 1: [rec(1, 5, 5)]}, 2, None, id="nothing-pending"),
    pytest.param({0: [RankProgress(0)], 1: [RankProgress(1)]}, 2, None, id="nothing-issued"),
    pytest.param({}, 2, None, id="no-records"),
    pytest.param(
        {0: [rec(0, 3, 2, "a")], 1: [rec(1, 3, 2, "a")], 2: [rec(2, 4, 3, "b")]},
        3,
        None,
        id="ranks-on-their-way",
    ),
    pytest.param(
        {
            **{r: [rec(r, 1043, 1042, "grad.layer4.weight")] for r in range(7)},
            7: [moving(rec(7, 1042, 1042))],
        },
        8,
        None,
        id="one-rank-behind-but-moving",
    ),
    pytest.param(
        {0: [rec(0, 2, 1, "s", process_set=1)], 1: [rec(1, 1, 1, process_set=1)], 2: [moving(rec(2, 9, 8))]},
        3,
        "rank 0 waits in allreduce `s` (#2, process set 1); rank 1 never issued it: its last completed is #1",
        id="another-set-moving",
    ),
    pytest.param(
        {0: [rec(0, 3, 2, "a")], 1: [rec(1, 4, 3, "b")], 2: [rec(2, 2, 2)]},
        3,
        "rank 0 waits in allreduce `a` (#3, process set 0); rank 2 never issued it: its last completed is "
        "#2; rank 1 waits in allreduce `b` (#4)",
        id="two-waits-and-one-behind",
    ),
    pytest.param(
        {0: [rec(0, 2, 1, "s", process_set=1)], 1: [rec(1, 1, 1, process_set=1)], 2: []},
        3,
        "rank 0 waits in allreduce `s` (#2, process set 1); rank 1 never issued it: its last completed is #1",
        id="other-process-set",
    ),
]


@pytest.mark.parametrize(("progress", "world", "expected"), CASES)
def test_collective_verdict(
    progress: dict[int, list[RankProgress]], world: int, expected: str | None
) -> None:
    places = {7: "data_loader, train.py:88"}
    assert collective_verdict(progress, range(world), places) == expected


def test_records_from_an_agents_answer_leave_out_what_is_malformed() -> None:
    answer = [
        {"source": "collectives", "process_set": 0, "issued": {"seq": 3, "kind": "allreduce", "name": "a"},
         "done": {"seq": 2, "kind": "allreduce", "name": "b"}},
        "garbage",
        {"process_set": "x"},
        {"source": "torch (gloo)", "note": "torch's gloo backend keeps no trace here"},
        {"process_set": 1, "issued": {"seq": "no"}, "done": None, "moving": "yes"},
        {"process_set": 2, "issued": None, "done": None, "moving": True},
    ]  # fmt: skip
    records = records_of(4, answer)
    assert records[0] == RankProgress(4, 0, "collectives", Op(3, "allreduce", "a"), Op(2, "allreduce", "b"))
    assert (
        records[1].note and records[2] == RankProgress(4, 1) and records[3] == RankProgress(4, 2, moving=True)
    )
    assert len(records) == 4
    assert records_of(4, None) == () and records_of(4, {"a": 1}) == ()
    assert progress_line(records) == (
        "last issued allreduce `a` (#3), last completed #2 (process set 0); torch's gloo backend keeps no "
        "trace here; last issued none since init(), last completed none (process set 1); last issued none "
        "since init(), last completed none (process set 2, moving)"
    )


def _rank(rank: int, func: str, records: list[dict[str, object]]) -> RankStacks:
    frames = (Frame("<module>", "/job/train.py", 10), Frame(func, "/job/train.py", 20))
    return RankStacks.from_json(
        "h",
        {
            "rank": rank,
            "pid": 100 + rank,
            "source": "faulthandler",
            "threads": [
                {"name": "", "main": True, "frames": [list(f.__dict__.values())[:3] for f in frames]}
            ],
            "collectives": records,
        },
    )


def test_stacks_print_each_groups_collectives_and_the_verdict_names_the_rank_behind() -> None:
    waiting = [
        {"process_set": 0, "issued": {"seq": 8, "kind": "allreduce", "name": "grad.w"},
         "done": {"seq": 7, "kind": "allreduce", "name": "grad.v"}}
    ]  # fmt: skip
    idle = [{"process_set": 0, "issued": {"seq": 7, "kind": "allreduce", "name": "grad.v"},
             "done": {"seq": 7, "kind": "allreduce", "name": "grad.v"}}]  # fmt: skip
    stacks = [_rank(r, "step", waiting) for r in range(3)] + [_rank(3, "data_loader", idle)]
    dump = StackDump.of("request", 0.0, 4, stacks)
    lines = dump.lines()
    assert "  collectives: last issued allreduce `grad.w` (#8), last completed #7 (process set 0)" in lines
    assert "  collectives: last issued allreduce `grad.v` (#7), last completed #7 (process set 0)" in lines
    assert lines[-1] == (
        "verdict: ranks 0-2 wait in allreduce `grad.w` (#8, process set 0); rank 3 never issued it: its last "
        "completed is #7; rank 3's stack: data_loader, train.py:20"
    )


def test_a_busy_jobs_records_moving_name_nobody_behind_and_say_so() -> None:
    """The same records as above, but rank 3's moved while it was read: the stacks' own verdict, and the
    words that the job is on its way."""
    waiting = [
        {"process_set": 0, "issued": {"seq": 8, "kind": "allreduce", "name": "grad.w"},
         "done": {"seq": 7, "kind": "allreduce", "name": "grad.v"}}
    ]  # fmt: skip
    idle = [{"process_set": 0, "issued": {"seq": 7, "kind": "allreduce", "name": "grad.v"},
             "done": {"seq": 7, "kind": "allreduce", "name": "grad.v"}, "moving": True}]  # fmt: skip
    stacks = [_rank(r, "step", waiting) for r in range(3)] + [_rank(3, "data_loader", idle)]
    lines = StackDump.of("request", 0.0, 4, stacks).lines()
    assert (
        "  collectives: last issued allreduce `grad.v` (#7), last completed #7 (process set 0, moving)"
        in lines
    )
    assert lines[-1] == (
        "verdict: the ranks are in 2 different places, none in a collective; the fewest, rank 3, in "
        "data_loader, train.py:20; collectives moving (process set 0): on their way, not stalled"
    )


def test_without_records_the_stacks_verdict_stays() -> None:
    dump = StackDump.of("request", 0.0, 2, [_rank(0, "step", []), _rank(1, "step", [])])
    assert dump.collectives == ()
    assert dump.verdict == "both ranks are at the same place, not in a collective: in step, train.py:20"


def test_the_reports_stack_dump_carries_the_records_and_fits_the_schema() -> None:
    import json

    import jsonschema

    from tests.support import REPO

    schema = json.loads((REPO / "docs" / "report.schema.json").read_text())
    dump_schema = {"$defs": schema["$defs"], "$ref": "#/$defs/stack_dump"}
    records = [
        {"process_set": 0, "issued": {"seq": 2, "kind": "allreduce", "name": "g"}, "done": None},
        {"source": "torch (gloo)", "note": "no trace: torch's flight recorder is off"},
    ]
    dump = StackDump.of("timeout", 1.0, 2, [_rank(0, "step", records), _rank(1, "step", [])])
    data = dump.to_json()
    jsonschema.validate(data, dump_schema)
    assert data["collectives"][0] == {
        "rank": 0,
        "process_set": 0,
        "source": "collectives",
        "issued": {"seq": 2, "kind": "allreduce", "name": "g"},
        "done": None,
        "note": None,
        "moving": False,
    }
    assert data["verdict"].startswith("rank 0 waits in allreduce `g` (#2, process set 0); rank 1 never")
    assert "collectives" not in StackDump.of("request", 1.0, 1, [_rank(0, "step", [])]).to_json()
