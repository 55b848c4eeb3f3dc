"""A rank's samples over a run, kept in bounded memory for `--report` and `distrun plot` (pure).

`Series` holds at most `limit` points whatever the run's length: when full it halves itself by merging
neighbouring pairs, and from then on merges every `stride` incoming samples into one point, so the points stay
evenly spaced in time and a week-long run costs what a minute-long one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

LIMIT = 500  # points per rank in a report


@dataclass(frozen=True)
class Point:
    """One rank at `t` (seconds since distrun started); None where unknown (no GPU, no progress bar)."""

    t: float
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    gpu_util_percent: float | None = None
    gpu_memory_bytes: int | None = None
    steps_per_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "cpu_percent": _round(self.cpu_percent),
            "rss_bytes": self.rss_bytes,
            "gpu_util_percent": _round(self.gpu_util_percent),
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "steps_per_s": None if self.steps_per_s is None else round(self.steps_per_s, 4),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        return cls(
            t=float(data["t"]),
            cpu_percent=data.get("cpu_percent"),
            rss_bytes=data.get("rss_bytes"),
            gpu_util_percent=data.get("gpu_util_percent"),
            gpu_memory_bytes=data.get("gpu_memory_bytes"),
            steps_per_s=data.get("steps_per_s"),
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _mean_int(values: Iterable[int | None]) -> int | None:
    mean = _mean(values)
    return None if mean is None else round(mean)


def merge(points: Sequence[Point]) -> Point:
    """One point standing for `points`: their mean time and the mean of each known value."""
    return Point(
        t=sum(p.t for p in points) / len(points),
        cpu_percent=_mean(p.cpu_percent for p in points),
        rss_bytes=_mean_int(p.rss_bytes for p in points),
        gpu_util_percent=_mean(p.gpu_util_percent for p in points),
        gpu_memory_bytes=_mean_int(p.gpu_memory_bytes for p in points),
        steps_per_s=_mean(p.steps_per_s for p in points),
    )


class Series:
    """At most `limit` evenly spaced points of one rank, however many were added."""

    def __init__(self, limit: int = LIMIT) -> None:
        if limit < 2:
            raise ValueError("a series keeps at least 2 points")
        self.limit = limit
        self.stride = 1  # samples per point from now on
        self._points: list[Point] = []
        self._pending: list[Point] = []  # samples not yet a point (fewer than `stride`)

    def add(self, point: Point) -> None:
        self._pending.append(point)
        if len(self._pending) < self.stride:
            return
        self._points.append(merge(self._pending) if self.stride > 1 else self._pending[0])
        self._pending = []
        if len(self._points) >= self.limit:
            pairs = zip(self._points[0::2], self._points[1::2], strict=False)
            halved = [merge(pair) for pair in pairs]
            if len(self._points) % 2:
                halved.append(self._points[-1])
            self._points = halved
            self.stride *= 2

    def points(self, since: float | None = None) -> list[Point]:
        """The points (and the samples not yet merged, as one), those at or after `since` where given."""
        kept = self._points + ([merge(self._pending)] if self._pending else [])
        return kept if since is None else [p for p in kept if p.t >= since]

    def __len__(self) -> int:
        return len(self._points) + (1 if self._pending else 0)
