"""Stragglers from the progress bars the ranks already draw: no change to the user's script (pure).

A tqdm-style redraw (`\\r` then ` 42/100 [00:10<00:14,  4.10it/s]`) gives a rank's step count and rate. A rank
whose rate stays more than a quarter below the median rate of the ranks for `window` seconds is named once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Each starts only where a run of digits does: tried inside a long run too, every try consumed the rest of
# it, and a redraw of 20,000 digits took over a minute to read. A count is a whole run of at most 18 digits
# (int() refuses more than 4,300).
_COUNT = re.compile(rb"(?<!\d)(\d{1,18})/(\d{1,18})(?!\d)")
_RATE = re.compile(rb"(?<!\d)(\d+(?:\.\d+)?)\s*(it/s|s/it)")
SLOW_BELOW = 0.75  # of the median rate


@dataclass(frozen=True)
class Reading:
    """A rank's last progress: `n` of `total` steps, at `rate` steps per second (None: not shown)."""

    n: int
    total: int
    rate: float | None
    at: float

    def text(self) -> str:
        rate = "-" if self.rate is None else f"{self.rate:.3g} it/s"
        return f"{self.n}/{self.total} at {rate}"


def parse_progress(text: bytes) -> tuple[int, int, float | None] | None:
    """(n, total, steps per second) from a progress bar's text; None when it shows no `n/total`."""
    count = _COUNT.search(text)
    if count is None:
        return None
    rate = None
    found = _RATE.search(text, count.end())
    if found is not None:
        value = float(found.group(1))
        rate = value if found.group(2) == b"it/s" else (1.0 / value if value else None)
    return int(count.group(1)), int(count.group(2)), rate


def last_redraw(data: bytes) -> bytes | None:
    """The newest redrawn text in a chunk of output (after its last `\\r`), or None when it has none."""
    cr = data.rfind(b"\r")
    if cr < 0:
        return None
    text = data[cr + 1 :]
    if not text.strip():  # "\r\n" ends a bar: its text is the line before
        start = data.rfind(b"\r", 0, cr)
        text = data[start + 1 : cr]
    end = text.find(b"\n")
    return text if end < 0 else text[:end]


@dataclass(frozen=True)
class Straggler:
    """A rank named slower than the others: how much, and for how long."""

    rank: int
    host: str
    ratio: float  # its rate / the median rate when it was named
    seconds: float

    def text(self) -> str:
        ratio = f"{self.ratio:.2f}x the median step rate"
        return f"rank {self.rank} on {self.host}: {ratio} for {self.seconds:.0f} s"


def slow_ranks(rates: dict[int, float], below: float = SLOW_BELOW) -> dict[int, float]:
    """Ranks whose rate is under `below` times the median of all, with their ratio to the median."""
    if len(rates) < 2:
        return {}
    import statistics  # not on start-up's path: only once ranks have written for a while

    median = statistics.median(rates.values())
    if median <= 0:
        return {}
    return {rank: rate / median for rank, rate in rates.items() if rate < below * median}


class StragglerWatch:
    """Fed the ranks' output; `check` names each rank that has been slow for `window` seconds, once."""

    def __init__(self, hosts: dict[int, str], window: float) -> None:
        self.hosts = hosts
        self.window = window
        self._readings: dict[int, Reading] = {}
        self._first: dict[int, Reading] = {}
        self._unread: dict[int, tuple[bytes, float]] = {}
        self._slow_since: dict[int, float] = {}
        self.named: list[Straggler] = []

    def seen(self, rank: int, data: bytes, now: float) -> None:
        """A chunk of the rank's output: kept as it is, parsed only when asked (a bar redraws thousands of
        times a second, and only the newest redraw counts)."""
        if b"\r" in data:
            self._unread[rank] = (data, now)

    def readings(self) -> dict[int, Reading]:
        """Every rank's last progress, where it drew a bar."""
        for rank, (data, at) in self._unread.items():
            text = last_redraw(data)
            parsed = parse_progress(text) if text else None
            if parsed is None:
                continue
            n, total, rate = parsed
            first = self._first.setdefault(rank, Reading(n, total, rate, at))
            if rate is None and at > first.at and n > first.n:
                rate = (n - first.n) / (at - first.at)
            self._readings[rank] = Reading(n, total, rate, at)
        self._unread.clear()
        return self._readings

    def rates(self, now: float) -> dict[int, float]:
        """Every rank's rate where its bar moved within half the window (a silent rank is a stall)."""
        return {
            rank: r.rate
            for rank, r in self.readings().items()
            if r.rate is not None and now - r.at <= self.window / 2
        }

    def check(self, now: float) -> list[Straggler]:
        """The ranks newly found slow for `window` seconds."""
        slow = slow_ranks(self.rates(now))
        for rank in list(self._slow_since):
            if rank not in slow:
                del self._slow_since[rank]
        named = {s.rank for s in self.named}
        fresh = []
        for rank, ratio in sorted(slow.items()):
            since = self._slow_since.setdefault(rank, now)
            if rank not in named and now - since >= self.window:
                fresh.append(Straggler(rank, self.hosts.get(rank, "?"), ratio, now - since))
        self.named.extend(fresh)
        return fresh
