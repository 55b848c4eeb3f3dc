"""Grouping stacks, the rank-range notation, the verdict and the dump parsers, table-tested (issue 17)."""

from __future__ import annotations

import json

import pytest

from launcher.agent.stackdump import parse_faulthandler, parse_py_spy
from launcher.diagnose.stacks import (
    Frame,
    RankStacks,
    StackDump,
    ThreadStack,
    group_stacks,
    rank_ranges,
    verdict,
)

SITE = "/venv/lib/python3.11/site-packages"
BARRIER = (
    Frame("<module>", "/job/train.py", 12),
    Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
    Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 5356),
)
LOADER = (Frame("<module>", "/job/train.py", 11), Frame("stuck_in_loader", "/job/train.py", 41))
SLEEPING = (*LOADER, Frame("clock_nanosleep", "/usr/lib/libc.so.6", native=True))


def rank(number: int, frames: tuple[Frame, ...], host: str = "h1", error: str = "") -> RankStacks:
    threads = () if error else (ThreadStack("", frames, main=True),)
    return RankStacks(number, host, 100 + number, "faulthandler", threads, error)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0], "0"),
        ([0, 1, 3], "0-1,3"),
        ([3, 1, 0, 2], "0-3"),
        ([0, 2, 4, 5, 6, 9], "0,2,4-6,9"),
        ([7, 7, 8], "7-8"),
        ([], ""),
    ],
)
def test_rank_ranges_read_as_ranks_takes_them(ranks: list[int], text: str) -> None:
    assert rank_ranges(ranks) == text


def test_the_odd_rank_out_comes_first_and_rank_zero_is_not_privileged() -> None:
    stacks = [rank(0, BARRIER), rank(1, BARRIER, "h1"), rank(2, LOADER, "h2"), rank(3, BARRIER, "h2")]
    groups = group_stacks(stacks)
    assert [(g.ranks, g.hosts) for g in groups] == [((2,), ("h2",)), ((0, 1, 3), ("h1", "h2"))]


def test_groups_of_equal_size_go_by_lowest_rank_and_unreadable_ranks_last_by_reason() -> None:
    stacks = [
        rank(0, BARRIER, error="not a Python process (bash)"),
        rank(1, LOADER),
        rank(2, BARRIER),
        rank(3, BARRIER, error="not a Python process (bash)"),
        rank(4, BARRIER, error="it has exited"),
    ]
    groups = group_stacks(stacks)
    assert [(g.ranks, g.error) for g in groups] == [
        ((1,), ""),
        ((2,), ""),
        ((4,), "it has exited"),
        ((0, 3), "not a Python process (bash)"),
    ]


def test_native_frames_read_for_one_rank_only_do_not_split_a_group_and_are_shown() -> None:
    groups = group_stacks([rank(0, LOADER), rank(1, SLEEPING), rank(2, BARRIER)])
    assert [(g.ranks, g.sample.rank) for g in groups] == [((2,), 2), ((0, 1), 1)]


def test_thread_order_and_ids_do_not_split_a_group() -> None:
    helper = ThreadStack("", (Frame("run", "/job/loader.py", 5),))
    main = ThreadStack("", BARRIER, main=True)
    a = RankStacks(0, "h1", 1, "faulthandler", (helper, main))
    b = RankStacks(1, "h1", 2, "faulthandler", (main, helper))
    assert [g.ranks for g in group_stacks([a, b])] == [(0, 1)]


@pytest.mark.parametrize(
    ("stacks", "expected"),
    [
        (
            [rank(0, BARRIER), rank(1, BARRIER), rank(2, LOADER), rank(3, BARRIER)],
            "3 ranks wait in a collective (barrier); rank 2 is elsewhere: in stuck_in_loader, train.py:41",
        ),
        (
            [rank(0, BARRIER), rank(1, LOADER), rank(2, BARRIER[:1])],
            "1 rank waits in a collective (barrier); ranks 1-2 are elsewhere: "
            "rank 1 in stuck_in_loader, train.py:41; rank 2 in <module>, train.py:12",
        ),
        (
            [rank(0, BARRIER), rank(1, BARRIER)],
            "both ranks wait in the same collective (barrier) at <module>, train.py:12",
        ),
        (
            [rank(0, LOADER), rank(1, LOADER), rank(2, LOADER)],
            "all 3 ranks are at the same place, not in a collective: in stuck_in_loader, train.py:41",
        ),
        ([rank(0, LOADER)], "rank 0 is not in a collective: in stuck_in_loader, train.py:41"),
        (
            [rank(0, LOADER), rank(1, LOADER), rank(2, BARRIER[:1])],
            "the ranks are in 2 different places, none in a collective; the fewest, rank 2, in "
            "<module>, train.py:12",
        ),
        (
            [rank(0, BARRIER), rank(1, BARRIER), rank(2, BARRIER, error="it has exited")],
            "both ranks wait in the same collective (barrier) at <module>, train.py:12; "
            "1 rank could not be read",
        ),
        ([rank(0, (), error="no stacks within 10s")], "no rank's stack could be read (1 rank)"),
    ],
)
def test_verdict(stacks: list[RankStacks], expected: str) -> None:
    assert verdict(group_stacks(stacks), len(stacks)) == expected


def test_native_collective_frames_count_when_there_is_no_python_one() -> None:
    nccl = (
        Frame("<module>", "/job/train.py", 3),
        Frame("ncclAllReduce", "/usr/lib/libnccl.so.2", native=True),
    )
    stacks = [rank(0, nccl), rank(1, LOADER)]
    assert verdict(group_stacks(stacks), 2).startswith("1 rank waits in a collective (ncclAllReduce); rank 1")


def test_a_dump_reads_as_grouped_tracebacks_innermost_frame_last() -> None:
    stacks = [rank(0, BARRIER), rank(1, LOADER, "h2"), rank(2, (), "h2", error="it has exited")]
    lines = StackDump.of("timeout", 0.0, 4, stacks).lines()
    assert lines == [
        "rank 0 (1 of 4) on h1:",
        "  main thread:",
        '    File "/job/train.py", line 12, in <module>',
        f'    File "{SITE}/torch/distributed/c10d_logger.py", line 83, in wrapper',
        f'    File "{SITE}/torch/distributed/distributed_c10d.py", line 5356, in barrier',
        "rank 1 (1 of 4) on h2:",
        "  main thread:",
        '    File "/job/train.py", line 11, in <module>',
        '    File "/job/train.py", line 41, in stuck_in_loader',
        "rank 2 (1 of 4) on h2: cannot read the stacks: it has exited",
        "verdict: 1 rank waits in a collective (barrier); rank 1 is elsewhere: "
        "in stuck_in_loader, train.py:41; 1 rank could not be read",
    ]


FAULTHANDLER = """\
Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/job/loader.py", line 5 in run

Current thread 0x00007f0 (most recent call first):
  File "/job/train.py", line 41 in stuck_in_loader
  File "/job/train.py", line 11 in <module>
"""


def test_faulthandler_dump_parsed_outermost_first_main_thread_last() -> None:
    threads = parse_faulthandler(FAULTHANDLER)
    assert threads == [
        {
            "name": "",
            "frames": [["run", "/job/loader.py", 5], ["wait", "/usr/lib/python3.11/threading.py", 320]],
        },
        {
            "name": "",
            "main": True,
            "frames": [["<module>", "/job/train.py", 11], ["stuck_in_loader", "/job/train.py", 41]],
        },
    ]
    assert RankStacks.from_json("h1", {"rank": 3, "threads": threads}).main_stack == ThreadStack(
        "", LOADER, True
    )


def test_py_spy_dump_parsed_without_unresolved_native_addresses() -> None:
    dump = [
        {
            "thread_name": "MainThread",
            "os_thread_id": 42,
            "frames": [
                {
                    "name": "clock_nanosleep",
                    "filename": "/usr/lib/libc.so.6",
                    "module": "/usr/lib/libc.so.6",
                    "line": 0,
                },
                {"name": "stuck_in_loader", "filename": "/job/train.py", "module": None, "line": 41},
                {"name": "0x7f93d7ea71f5", "filename": "/usr/lib/libc.so.6", "module": "/usr/lib/libc.so.6"},
                {"name": "<module>", "filename": "/job/train.py", "module": None, "line": 11},
            ],
        }
    ]
    assert parse_py_spy(json.dumps(dump), 42) == [
        {
            "name": "MainThread",
            "main": True,
            "frames": [
                ["<module>", "/job/train.py", 11, False],
                ["stuck_in_loader", "/job/train.py", 41, False],
                ["clock_nanosleep", "/usr/lib/libc.so.6", 0, True],
            ],
        }
    ]


def test_ranks_with_two_helper_threads_of_different_stacks_group_without_error() -> None:
    def thread(name: str, func: str) -> ThreadStack:
        frames = (Frame("run", "/usr/lib/python3.11/threading.py", 10), Frame(func, "t.py", 3))
        return ThreadStack(name, frames)

    stacks = [
        RankStacks(rank, "h1", threads=(thread("a", "sleep_a"), thread("b", "sleep_b"), thread("m", "main")))
        for rank in range(2)
    ]
    groups = group_stacks(stacks)
    assert [g.ranks for g in groups] == [(0, 1)]
