"""Progress parsing and straggler math, table-tested (issue 17)."""

from __future__ import annotations

import time

import pytest

from launcher.diagnose.stragglers import StragglerWatch, last_redraw, parse_progress, slow_ranks


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (b" 42%|####      | 42/100 [00:10<00:14,  4.10it/s]", (42, 100, 4.1)),
        (b"epoch 1: 3/8 [00:30<00:50, 10.00s/it, loss=0.3]", (3, 8, 0.1)),
        (b"12/50", (12, 50, None)),
        (b"loading 7/9 files 3.5 MB/s", (7, 9, None)),
        (b"no progress here", None),
        (b"0/10 [00:00<?, ?it/s]", (0, 10, None)),
    ],
)
def test_parse_progress(text: bytes, parsed: tuple[int, int, float | None] | None) -> None:
    assert parse_progress(text) == parsed


@pytest.mark.parametrize(
    ("chunk", "text"),
    [
        (b"\r 1/10\r 2/10", b" 2/10"),
        (b"\r10/10 done\n", b"10/10 done"),
        (b"\r 9/10\r\n", b" 9/10"),
        (b"plain line\n", None),
    ],
)
def test_last_redraw(chunk: bytes, text: bytes | None) -> None:
    assert last_redraw(chunk) == text


@pytest.mark.parametrize(
    ("rates", "slow"),
    [
        ({0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}, {}),
        ({0: 10.0, 1: 10.0, 2: 5.0, 3: 10.0}, {2: 0.5}),
        ({0: 10.0, 1: 10.0, 2: 7.6, 3: 10.0}, {}),  # within 25% of the median: not slow
        ({0: 10.0, 1: 2.0}, {1: 2.0 / 6.0}),
        ({0: 4.0}, {}),  # one rank has nobody to be slower than
        ({0: 0.0, 1: 0.0}, {}),
    ],
)
def test_slow_ranks(rates: dict[int, float], slow: dict[int, float]) -> None:
    assert slow_ranks(rates) == pytest.approx(slow)


def test_a_slow_rank_is_named_once_after_the_window_and_equal_ranks_never() -> None:
    watch = StragglerWatch({0: "h1", 1: "h1", 2: "h2"}, window=60.0)
    named = []
    for second in range(0, 200):
        now = float(second)
        for r, rate in ((0, 4.0), (1, 4.0), (2, 2.0)):
            watch.seen(r, b"\r %d/1000 [00:01<00:02, %.2fit/s]" % (second, rate), now)
        named += watch.check(now)
    assert [(s.rank, s.host, round(s.ratio, 2), s.seconds) for s in named] == [(2, "h2", 0.5, 60.0)]
    assert named[0].text() == "rank 2 on h2: 0.50x the median step rate for 60 s"
    assert watch.readings()[2].n == 199


def test_a_rank_that_catches_up_starts_its_window_again() -> None:
    watch = StragglerWatch({0: "h", 1: "h", 2: "h"}, window=10.0)
    named = []
    for second in range(30):
        slow = 2.0 if second % 8 else 4.0  # back to speed every 8 s: never slow for 10 s in a row
        for r, rate in ((0, 4.0), (1, 4.0), (2, slow)):
            watch.seen(r, b"\r1/9 [%.1fit/s]" % rate, float(second))
        named += watch.check(float(second))
    assert named == []


def test_a_silent_rank_is_a_stall_not_a_straggler() -> None:
    watch = StragglerWatch({0: "h", 1: "h", 2: "h"}, window=10.0)
    watch.seen(2, b"\r1/9 [0.5it/s]", 0.0)
    named = []
    for second in range(40):
        for r in (0, 1):
            watch.seen(r, b"\r%d/99 [4.0it/s]" % second, float(second))
        named += watch.check(float(second))
    assert named == []


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (b"7" * 200_000, None),
        (b"1/2 " + b"3" * 200_000, (1, 2, None)),
        (b"1/2 1." + b"5" * 200_000, (1, 2, None)),
        (b"3" * 200_000 + b"/4 5it/s", None),
        (b"x 12/" + b"4" * 30 + b" 5it/s", None),
    ],
)
def test_a_redraw_of_a_long_run_of_digits_is_read_once(text: bytes, parsed: object) -> None:
    """Tried from every digit, a redraw of 20,000 digits took over a minute (the relay reads every redraw)."""
    start = time.monotonic()
    assert parse_progress(text) == parsed
    assert time.monotonic() - start < 10
