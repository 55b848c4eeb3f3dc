"""Stacks people can read, and deep stacks grouped on the whole stack (issue 27, items 10 and 14), in-process.

tests/integration/test_stacks_readable.py shows the same from real ranks.
"""

from __future__ import annotations

import pytest

from launcher.agent.stackdump import parse_faulthandler, parse_whole
from launcher.diagnose.readable import MOST_LINES, package_of, readable, shorten_symbol
from launcher.diagnose.stacks import OTHERS_UNREAD, Frame, RankStacks, StackDump, ThreadStack, group_stacks

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
PYBIND = (
    "pybind11::cpp_function::initialize<pybind11::cpp_function::initialize<void, c10d::ProcessGroup, "
    "std::vector<at::Tensor, std::allocator<at::Tensor> >&>(void (c10d::ProcessGroup::*)(std::vector<at::"
    "Tensor, std::allocator<at::Tensor> >&))::{lambda(c10d::ProcessGroup*, std::vector<at::Tensor, std::"
    "allocator<at::Tensor> >&)#1}, void, c10d::ProcessGroup*, std::vector<at::Tensor, std::allocator<at::"
    "Tensor> >&, pybind11::name, pybind11::is_method, pybind11::sibling>(...)::{lambda(pybind11::detail::"
    "function_call&)#3}::_FUN"
) * 5


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (PYBIND, None),
        ("gloo::transport::tcp::Pair::recv", "gloo::transport::tcp::Pair::recv"),
        ("c10d::Work::wait()", "c10d::Work::wait()"),
        ("std::function<void ()>::operator()() const", "std::function<...>::operator()() const"),
        ("c10d::ProcessGroupGloo::runLoop(int)", "c10d::ProcessGroupGloo::runLoop(...)"),
        ("std::vector<int, std::allocator<int> >::push_back", "std::vector<...>::push_back"),
        ("std::ostream::operator<<(int)", "std::ostream::operator<<(...)"),
        ("a::operator<(b<c> const&)", "a::operator<(...)"),
        ("f<(a>b)>", "f<...>"),
        ("broken<unbalanced", "broken<unbalanced"),
    ],
)
def test_cpp_template_arguments_are_shortened(name: str, short: str | None) -> None:
    got = shorten_symbol(name)
    if short is not None:
        assert got == short
    else:
        assert len(name) > 1500 and len(got) <= 160, got
        assert got.startswith("pybind11::cpp_function::initialize<...>(...)::{lambda(...)#3}::_FUN")


@pytest.mark.parametrize(
    ("file", "package"),
    [
        (f"{SITE}/_pytest/python.py", "pytest"),
        (f"{SITE}/pluggy/_hooks.py", "pluggy"),
        (f"{SITE}/six.py", "six"),
        ("/usr/lib/python3/dist-packages/yaml/__init__.py", "yaml"),
        (f"{STDLIB}/threading.py", "threading"),
        (f"{STDLIB}/concurrent/futures/thread.py", "concurrent"),
        ("<frozen importlib._bootstrap>", "importlib"),
    ],
)
def test_a_library_frame_is_named_by_its_package(file: str, package: str) -> None:
    assert package_of(file) == package


def _frames(*frames: Frame) -> ThreadStack:
    return ThreadStack("", frames, main=True)


PYTEST_RUN = tuple(
    Frame(f"hook_{i}", f"{SITE}/{'pluggy/_callers.py' if i % 3 else '_pytest/runner.py'}", 10 + i)
    for i in range(27)
)
UNDER_PYTEST = _frames(
    Frame("<module>", "/venv/bin/pytest", 8),
    *PYTEST_RUN,
    Frame("test_hangs", "/job/tests/test_train.py", 5),
    Frame("wait", f"{STDLIB}/threading.py", 320),
    Frame("acquire", f"{STDLIB}/threading.py", 1100),
)


def _lines(thread: ThreadStack, full: bool = False) -> list[str]:
    dump = StackDump.of("request", 0.0, 1, [RankStacks(0, "h1", 1, "py-spy", (thread,))])
    return dump.lines(full=full)


def test_runs_of_library_frames_fold_and_the_innermost_stays() -> None:
    lines = _lines(UNDER_PYTEST)
    assert lines[2:] == [
        '    File "/venv/bin/pytest", line 8, in <module>',
        "    ... 27 frames in pytest, pluggy",
        '    File "/job/tests/test_train.py", line 5, in test_hangs',
        f'    File "{STDLIB}/threading.py", line 320, in wait',
        f'    File "{STDLIB}/threading.py", line 1100, in acquire',
        "verdict: rank 0 is not in a collective: in test_hangs, test_train.py:5",
    ]
    full = _lines(UNDER_PYTEST, full=True)
    assert len(full) == len(UNDER_PYTEST.frames) + 3, "--output-dir keeps every frame"


def test_the_verdicts_collective_frame_is_never_folded() -> None:
    """torch.distributed frames are library frames, but the one the verdict names stays whole."""
    torch = f"{SITE}/torch/distributed"
    thread = _frames(
        Frame("<module>", "/job/train.py", 3),
        Frame("a", f"{torch}/c10d_logger.py", 1),
        Frame("barrier", f"{torch}/distributed_c10d.py", 2),
        *(Frame(f"inner_{i}", f"{SITE}/helper/x.py", i) for i in range(5)),
        Frame(PYBIND, "libtorch_python.so", native=True),
    )
    lines = _lines(thread)
    assert f'    File "{torch}/distributed_c10d.py", line 2, in barrier' in lines
    assert "    ... 5 frames in helper" in lines
    # A native frame the verdict does not name is shortened on the console, kept whole in the file.
    assert any(line.startswith("    [native] pybind11::cpp_function::initialize<...>(...)") for line in lines)
    assert len(max(lines, key=len)) < 200
    assert any(PYBIND in line for line in _lines(thread, full=True))


def _recursion(caller: str, depth: int) -> tuple[Frame, ...]:
    return (
        Frame("<module>", "/job/train.py", 30),
        Frame(caller, "/job/train.py", 20),
        *(Frame("walk", "/job/tree.py", 7) for _ in range(depth)),
        Frame("leaf", "/job/tree.py", 3),
    )


def test_a_deep_stack_keeps_both_ends_and_marks_the_middle() -> None:
    lines = _lines(_frames(*_recursion("from_left", 300)))
    frames = lines[2:-1]
    assert len(frames) <= MOST_LINES
    assert frames[0] == '    File "/job/train.py", line 30, in <module>'
    assert frames[1] == '    File "/job/train.py", line 20, in from_left'
    assert frames[-1] == '    File "/job/tree.py", line 3, in leaf'
    marks = [line for line in frames if line.startswith("    ...")]
    assert marks == ["    ... 268 frames not shown (in walk)"]


def test_ranks_recursing_from_different_callers_are_two_groups() -> None:
    left = RankStacks(0, "h1", 1, "faulthandler", (_frames(*_recursion("from_left", 300)),))
    right = RankStacks(1, "h1", 2, "faulthandler", (_frames(*_recursion("from_right", 300)),))
    groups = group_stacks([left, right])
    assert [g.ranks for g in groups] == [(0,), (1,)]
    dump = StackDump.of("request", 0.0, 2, [left, right])
    assert "same place" not in dump.verdict


FAULTHANDLER_CUT = (
    "Current thread 0x00007f (most recent call first):\n"
    + ('  File "/job/tree.py", line 7 in walk\n' * 100)
    + "  ...\n"
)


def test_a_cut_faulthandler_dump_is_marked_and_the_verdict_says_so() -> None:
    threads = parse_faulthandler(FAULTHANDLER_CUT)
    assert threads[0]["truncated"] is True and len(threads[0]["frames"]) == 100
    stacks = [
        RankStacks.from_json("h1", {"rank": r, "pid": r, "source": "faulthandler", "threads": threads})
        for r in (0, 1)
    ]
    dump = StackDump.of("request", 0.0, 2, stacks)
    assert dump.verdict.endswith("; ranks 0-1: stacks cut at 100 frames, they may differ further out")
    assert "    ... outer frames not read (faulthandler stops at 100)" in dump.lines()
    assert dump.to_json()["groups"][0]["threads"][0]["truncated"] is True


def test_the_main_thread_read_alone_says_its_other_threads_were_not_read() -> None:
    """The hook's faulthandler writes the main thread alone; the agent marks it where the rank has other
    threads and their whole stacks did not come: the line says so, and the report carries the mark."""
    text = (
        "Stack (most recent call first):\n"
        '  File "/job/t.py", line 9 in wait\n'
        '  File "/job/t.py", line 2 in <module>\n'
    )
    threads = parse_faulthandler(text)
    assert threads == [
        {"name": "", "main": True, "frames": [["<module>", "/job/t.py", 2], ["wait", "/job/t.py", 9]]}
    ]
    threads[0]["others_unread"] = True
    stacks = [RankStacks.from_json("h1", {"rank": 0, "pid": 5, "source": "faulthandler", "threads": threads})]
    dump = StackDump.of("request", 0.0, 1, stacks)
    lines = dump.lines()
    assert lines[lines.index("  main thread:") + 3] == f"  other threads: {OTHERS_UNREAD}", lines
    assert dump.to_json()["groups"][0]["threads"][0]["others_unread"] is True
    assert dump.verdict == "rank 0 is not in a collective: in wait, t.py:9", dump.verdict


def test_the_whole_dump_of_the_hooks_python_handler_is_read() -> None:
    text = (
        "thread\t1\tMainThread\n1\t<module>\t/job/t.py\n7\twalk\t/job/a\tb.py\n"
        "thread\t0\tloader\n9\trun\t/x/threading.py\n"
    )
    threads = parse_whole(text)
    assert [(t["name"], t["main"]) for t in threads] == [("loader", False), ("MainThread", True)]
    assert threads[1]["frames"] == [["<module>", "/job/t.py", 1], ["walk", "/job/a\tb.py", 7]]
    assert "truncated" not in threads[1]


def test_short_stacks_are_shown_as_read() -> None:
    thread = _frames(Frame("<module>", "/job/train.py", 3), Frame("f", f"{STDLIB}/threading.py", 1))
    assert _lines(thread) == _lines(thread, full=True)
    assert readable(["/a.py"], ["f"], [False]) != []
