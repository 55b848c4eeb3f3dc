"""Property tests of the stack parsers and the grouping (issue 38, item 1): generated dumps of both stack
tools (faulthandler's text and the hook's whole dump; py-spy's JSON) with any threads, depths and native
frames, cut short or garbled, go from the agent's parser to the verdict without an error, and the same
stacks in any order give the same groups, lines and verdict.

Each test counts the examples it ran and prints the count (`pytest -s`); EXAMPLES is hypothesis' budget.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from launcher.agent.stackdump import parse_faulthandler, parse_py_spy, parse_whole
from launcher.diagnose.stacks import RankStacks, StackDump

EXAMPLES = 100
RAN: Counter[str] = Counter()
# No shrinking: on a shared machine it can take minutes; a failure prints its example and seed as drawn.
PROPERTIES = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
    phases=[Phase.explicit, Phase.generate],
)

FILES = st.sampled_from(
    [
        "/job/train.py",
        "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
        "/repo/collectives/elastic/run.py",
        "/repo/collectives/engine.py",
        "/usr/lib/python3.11/threading.py",
        "<frozen importlib._bootstrap>",
        "/job/a\tb.py",
        "",
    ]
)
FUNCS = st.sampled_from(
    ["<module>", "train", "run.<locals>.wrapper", "barrier", "_gather", "wait", "pthread_cond_wait"]
) | st.text(max_size=12)
NATIVE_SYMBOLS = st.sampled_from(
    ["clock_nanosleep", "gloo::Context::recv", "ncclAllReduce", "c10d::Work::wait", "0x7f93d7ea71f5", "?"]
)
LINES = st.integers(min_value=0, max_value=10**6)


@st.composite
def python_frames(draw: st.DrawFn) -> list[tuple[str, str, int]]:
    return draw(st.lists(st.tuples(FUNCS, FILES, LINES), max_size=12))


def _faulthandler_text(threads: list[tuple[bool, list[tuple[str, str, int]], bool]]) -> str:
    out: list[str] = []
    for current, frames, cut in threads:
        out.append(
            f"{'Current thread' if current else 'Thread'} 0x00007f{len(out):x} (most recent call first):"
        )
        out.extend(f'  File "{file}", line {line} in {func}' for func, file, line in reversed(frames))
        if cut:
            out.append("  ...")
        out.append("")
    return "\n".join(out)


def _whole_text(threads: list[tuple[bool, list[tuple[str, str, int]], bool]]) -> str:
    out = []
    for index, (main, frames, _) in enumerate(threads):
        out.append(f"thread\t{int(main)}\tThread-{index}")
        out.extend(f"{line}\t{func}\t{file}" for func, file, line in frames)
    return "\n".join(out) + "\n"


THREADS = st.lists(st.tuples(st.booleans(), python_frames(), st.booleans()), max_size=6)


@st.composite
def garbled(draw: st.DrawFn, text: str) -> str:
    """`text` cut anywhere, with lines of noise (or the tool's own markers) put anywhere."""
    if draw(st.booleans()):
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    lines = text.split("\n")
    noise = st.sampled_from(
        [
            "  ...",
            '  File "x.py", line',
            '  File "',
            "Thread 0x",
            "thread\t1",
            "thread",
            "12\tf",
            "\0\x1b[2J",
            "",
        ]
    ) | st.text(max_size=40)
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        lines.insert(draw(st.integers(min_value=0, max_value=len(lines))), draw(noise))
    return "\n".join(lines)


@st.composite
def py_spy_frames(draw: st.DrawFn) -> list[dict[str, Any]]:
    python = st.builds(
        lambda f: {"name": f[0], "filename": f[1], "module": None, "line": f[2]},
        st.tuples(FUNCS, FILES, LINES),
    )
    native = st.builds(
        lambda name, line: {
            "name": name,
            "filename": "/usr/lib/libc.so.6",
            "module": "libc.so.6",
            "line": line,
        },
        NATIVE_SYMBOLS,
        st.none() | LINES,
    )
    return draw(st.lists(python | native, max_size=12))


@st.composite
def py_spy_dump(draw: st.DrawFn, pid: int) -> Any:
    threads = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "thread_name": st.none() | st.text(max_size=10),
                    "os_thread_id": st.sampled_from([pid, pid + 1, None]),
                    "frames": py_spy_frames(),
                }
            ),
            max_size=6,
        )
    )
    # JSON of any shape where py-spy's is expected: an older or newer py-spy, another tool's output.
    anything = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
    frames_of_anything = st.fixed_dictionaries({"frames": anything})
    return draw(st.just(threads) | anything | st.lists(anything | frames_of_anything))


def _counted(name: str) -> Iterator[None]:
    RAN[name] += 1
    yield


@pytest.fixture(autouse=True, scope="module")
def _report_counts() -> Iterator[None]:
    yield
    print(f"\nstack properties: examples run: {dict(RAN)}")


def _through(threads: list[dict[str, Any]], rank: int = 0, host: str = "h1") -> RankStacks:
    return RankStacks.from_json(host, {"rank": rank, "pid": 100 + rank, "source": "x", "threads": threads})


def _dump_of(stacks: list[RankStacks]) -> tuple[list[str], list[str], str, dict[str, Any]]:
    dump = StackDump.of("request", 0.0, len(stacks), stacks)
    return dump.lines(), dump.lines(full=True), dump.verdict, dump.to_json()


def _all_the_way(parse: Callable[[str], list[dict[str, Any]]], text: str) -> None:
    threads = parse(text)
    json.dumps(threads)  # what the agent sends must encode
    _dump_of([_through(threads, 0), _through(threads, 1, "h2")])


@PROPERTIES
@given(st.data(), THREADS)
def test_faulthandler_dumps_of_any_shape_parse_and_group(data: st.DataObject, threads: Any) -> None:
    list(_counted("faulthandler"))
    text = data.draw(garbled(_faulthandler_text(threads)))
    parsed = parse_faulthandler(text)
    assert sum(1 for t in parsed if t.get("main")) <= 1
    _all_the_way(parse_faulthandler, text)


@PROPERTIES
@given(st.data(), THREADS)
def test_whole_dumps_of_any_shape_parse_and_group(data: st.DataObject, threads: Any) -> None:
    list(_counted("whole"))
    _all_the_way(parse_whole, data.draw(garbled(_whole_text(threads))))


@PROPERTIES
@given(st.data())
def test_py_spy_dumps_of_any_shape_parse_and_group(data: st.DataObject) -> None:
    list(_counted("py-spy"))
    text = json.dumps(data.draw(py_spy_dump(4242)))
    if data.draw(st.booleans()):
        text = data.draw(garbled(text))
    try:
        threads = parse_py_spy(text, 4242)
    except ValueError:  # not JSON: the agent reads the rank with faulthandler instead
        return
    assert all(not name.startswith("0x") for t in threads for name, _, _, native in t["frames"] if native)
    _all_the_way(lambda _: threads, text)


@PROPERTIES
@given(st.lists(THREADS, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_grouping_is_the_same_in_any_order(ranks: list[Any], random: Any) -> None:
    list(_counted("grouping"))
    stacks = [
        _through(parse_whole(_whole_text(threads)), rank, f"h{rank % 2}")
        for rank, threads in enumerate(ranks)
    ]
    shuffled = []
    for rank in stacks:
        threads = list(rank.threads)
        random.shuffle(threads)
        shuffled.append(RankStacks(rank.rank, rank.host, rank.pid, rank.source, tuple(threads)))
    random.shuffle(shuffled)
    assert _dump_of(shuffled) == _dump_of(stacks)
    # Ranks with the same stacks are one group: the same dump twice over doubles every group.
    twice = stacks + [RankStacks(r.rank + len(stacks), r.host, threads=r.threads) for r in stacks]
    groups = StackDump.of("request", 0.0, len(twice), twice).groups
    assert all(len(g.ranks) % 2 == 0 for g in groups)


def test_a_whole_dump_line_led_by_a_non_ascii_digit_is_not_a_frame() -> None:
    """A function name's newline can leave "³" first on a line: isdigit() holds for it, int() refuses it (the
    example hypothesis found)."""
    dump = "thread\t1\tMainThread\n³\t/job/a\tb.py\n12\tf\t/job/x.py\n"
    assert parse_whole(dump) == [{"name": "MainThread", "main": True, "frames": [["f", "/job/x.py", 12]]}]


def test_a_whole_dump_line_led_by_more_digits_than_int_takes_is_not_a_frame() -> None:
    """The same newline can leave 5,000 digits first, past int()'s 4,300."""
    dump = "thread\t1\tMainThread\n" + "7" * 5000 + "\t/job/a\tb.py\n12\tf\t/job/x.py\n"
    assert parse_whole(dump) == [{"name": "MainThread", "main": True, "frames": [["f", "/job/x.py", 12]]}]
