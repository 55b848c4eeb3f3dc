"""The start-up timeline: marks per host, the fan-out's hosts, and what -v prints (issue 17)."""

from __future__ import annotations

from launcher.core.progress import Progress
from launcher.core.timeline import Timeline, slowest


def test_marks_keep_the_first_time_and_the_fan_out_names_hosts() -> None:
    timeline = Timeline(start=100.0)
    clock = iter([100.5, 100.9, 101.0, 101.4])
    seen: list[Progress] = []
    hook = timeline.hook(seen.append, lambda: next(clock))
    hook(Progress("connecting", 2))  # no host: nothing to mark
    hook(Progress("connecting", 2, 1, host="h2"))
    hook(Progress("connecting", 2, 2, host="h1"))
    hook(Progress("starting agents", 2, 1, host="h1"))
    hook(Progress("starting agents", 2, 2, host="h2"))
    assert len(seen) == 5, "the progress line still hears everything"
    timeline.mark("h1", "probed", 102.0)
    timeline.mark("h1", "probed", 109.0)  # a restart does not rewrite the start-up
    assert timeline.wrote(0, "h1", 103.0) and not timeline.wrote(0, "h1", 104.0)
    assert timeline.to_json()[1] == {
        "host": "h1",
        "connected": 0.9,
        "agent": 1.0,
        "probed": 2.0,
        "started": None,
        "first_output": {"0": 3.0},
    }


def test_slowest_host_of_each_phase() -> None:
    timeline = Timeline(start=0.0)
    for host, probed, outputs in (("h1", 0.3, (1.0, 1.2)), ("h2", 1.5, (2.0, 4.5)), ("h3", 0.9, (1.1,))):
        timeline.mark(host, "probed", probed)
        for rank, at in enumerate(outputs):
            timeline.wrote(rank, host, at)
    assert slowest(timeline.hosts.values()) == [
        "start-up: probed: slowest h2 at 1.50s (fastest h1 at 0.30s)",
        "start-up: first output: slowest h2 at 4.50s (fastest h3 at 1.10s)",
    ]
