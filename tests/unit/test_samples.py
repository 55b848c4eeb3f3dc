"""A rank's samples over a run in bounded memory: the downsampler of the report's `samples` (pure)."""

from __future__ import annotations

import itertools

import pytest

from launcher.core.samples import LIMIT, Point, Series, merge


def test_a_long_run_keeps_at_most_the_limit_evenly_spaced_over_the_whole_run() -> None:
    series = Series()
    most = 0
    for i in range(100_000):  # 2.3 days at one sample every 2 s
        series.add(Point(t=2.0 * i, cpu_percent=float(i % 7), rss_bytes=1000))
        most = max(most, len(series))
    points = series.points()
    assert most <= LIMIT and len(points) <= LIMIT
    assert len(points) > LIMIT // 2  # halving never leaves it with little
    assert points[0].t < 2.0 * series.stride and points[-1].t > 2.0 * (100_000 - 2 * series.stride)
    gaps = [b.t - a.t for a, b in itertools.pairwise(points[:-1])]
    assert max(gaps) == pytest.approx(min(gaps))  # evenly spaced, the unmerged tail aside
    assert all(p.rss_bytes == 1000 for p in points)  # a constant stays itself through every merge
    mean = sum(p.cpu_percent or 0 for p in points[:-1]) / (len(points) - 1)
    assert mean == pytest.approx(3.0, abs=0.1)  # merging keeps the average


def test_a_short_run_keeps_every_sample_as_it_came() -> None:
    series = Series()
    added = [Point(t=float(i), cpu_percent=float(i), gpu_util_percent=None) for i in range(12)]
    for point in added:
        series.add(point)
    assert series.points() == added
    assert series.points(since=10.0) == added[10:]


def test_unknown_values_stay_unknown_and_known_ones_are_averaged() -> None:
    merged = merge([Point(0.0, None, 10, None, None, 2.0), Point(2.0, 50.0, 20, None, 300, None)])
    assert merged == Point(1.0, 50.0, 15, None, 300, 2.0)


def test_a_series_of_fewer_than_two_points_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        Series(limit=1)


def test_points_round_trip_through_the_report() -> None:
    point = Point(1.23456, 99.94, 1 << 30, 87.25, 5 << 30, 3.14159)
    assert Point.from_json(point.to_json()) == Point(1.235, 99.9, 1 << 30, 87.2, 5 << 30, 3.1416)
