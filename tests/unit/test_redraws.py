"""The status area on a real pseudo-terminal, read back through a terminal emulator (pyte)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from launcher.console.redraws import display_width, truncate
from launcher.console.relay import LogOptions, LogRelay
from tests.support import Terminal


@pytest.fixture
def term() -> Iterator[Terminal]:
    t = Terminal(60, 12)
    yield t
    t.close()


def _relay(term: Terminal, ranks: int, **options: object) -> LogRelay:
    return LogRelay(term.slave, term.slave, dict.fromkeys(range(ranks), "node1"), LogOptions(**options))  # type: ignore[arg-type]


def test_bars_live_at_the_bottom_while_lines_scroll_above(term: Terminal) -> None:
    relay = _relay(term, 2)
    relay.feed(1, "stderr", b"\r 20%|##        |")
    relay.feed(0, "stderr", b"\r 10%|#         |")  # shown in rank order, not arrival order
    relay.tick(1.0)
    assert term.lines()[:2] == ["[0]  10%|#         |", "[1]  20%|##        |"]
    relay.feed(0, "stdout", b"epoch 1 loss 0.5\n")
    relay.feed(0, "stderr", b"\r 60%|######    |")
    relay.tick(2.0)
    assert term.lines()[:3] == ["[0] epoch 1 loss 0.5", "[0]  60%|######    |", "[1]  20%|##        |"]
    relay.feed(0, "stderr", b"\r100%|##########|\n")
    relay.feed(1, "stderr", b"\r 90%|######### |")
    relay.finish()
    # The finished bar scrolled up as a line; the unfinished one is left as its final state.
    assert term.lines()[:4] == ["[0] epoch 1 loss 0.5", "[0] 100%|##########|", "[1]  90%|######### |", ""]


def test_status_lines_are_cut_to_the_width_and_never_wrap(term: Terminal) -> None:
    relay = _relay(term, 1)
    relay.feed(0, "stderr", b"\r" + "é".encode() * 200)
    relay.tick(1.0)
    shown = term.lines()
    assert shown[0] == "[0] " + "é" * 55 and shown[1] == ""


def test_more_bars_than_a_screenful_become_a_summary(term: Terminal) -> None:
    relay = _relay(term, 30)
    for rank in range(30):
        relay.feed(rank, "stderr", b"\r%3d%%|bar|" % (rank + 40))
    relay.tick(1.0)
    shown = [line for line in term.lines() if line]
    assert shown == [
        "[0]  40%|bar|",
        "[29]  69%|bar|",
        "distrun: 30 bars; the slowest and the fastest shown",
    ]


def test_with_host_prefixes_each_host_shows_its_newest_bar(term: Terminal) -> None:
    hosts = {0: "a", 1: "a", 2: "b"}
    relay = LogRelay(term.slave, term.slave, hosts, LogOptions(prefix="host"))
    relay.feed(0, "stderr", b"\rfirst")
    relay.feed(2, "stderr", b"\rother host")
    relay.feed(1, "stderr", b"\rnewest")
    relay.tick(1.0)
    assert sorted(line for line in term.lines() if line) == ["[a:1] newest", "[b:2] other host"]


def test_terminal_widths() -> None:
    assert display_width("abc") == 3 and display_width("日本") == 4 and display_width("e\u0301") == 1
    assert truncate("日本語", 5) == "日本" and truncate("abcdef", 3) == "abc"
