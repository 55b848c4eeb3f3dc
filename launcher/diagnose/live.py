"""The job's live view of its ranks: what `distrun top` shows, the console's host lines, the report's samples.

Fed by the running attempt (the agents' SAMPLES frames, the ranks' output, their exits) and read at any time,
in every phase: between attempts it still holds the last attempt's ranks, with how each ended. Each rank's
samples over the whole job are kept in a bounded `Series` (launcher.core.samples) for `--report`.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core.samples import Point, Series
from launcher.diagnose.stragglers import StragglerWatch
from launcher.errors import signal_name

if TYPE_CHECKING:  # the SAMPLES frames' types load with the first one
    from launcher.agent.sample_messages import RankSample, Samples

# A running rank that wrote nothing for this long is marked silent.
SILENT_AFTER = 30.0
# Lines per second are counted over about this many samples.
RATE_SAMPLES = 5


# An elastic attempt's world as its driver knows it now: (rank id, host) of each rank of the world in rank
# order, and rank id -> host of each rank that left it (lost, or told to leave). Asked at each answer.
World = tuple[Sequence[tuple[int, str]], Mapping[int, str]]


@dataclass(frozen=True)
class Seen:
    """The newest sample of a rank, and when (time.monotonic()) it came."""

    sample: RankSample
    at: float


class LiveView:
    """Every rank's newest sample, output rate and state; every rank's samples over the job."""

    def __init__(self, origin: float) -> None:
        """`origin`: when distrun started (time.monotonic()), t = 0 of the report's samples and timeline."""
        self.origin = origin
        self.interval = 0.0
        self.attempt = -1
        self.hosts: dict[int, str] = {}  # rank -> host, the current (or last) attempt's
        self.attempt_t = 0.0  # when the current attempt started, in t
        self.series: dict[int, Series] = {}
        self._seen: dict[int, Seen] = {}
        self._exits: dict[int, int] = {}
        self._wrote: dict[int, float] = {}
        self._lines: dict[int, int] = {}
        self._line_marks: dict[int, deque[tuple[float, int]]] = {}
        self._world: Callable[[], World] | None = None

    # -- the running attempt

    def attempt_started(
        self,
        hosts: Mapping[int, str],
        now: float,
        interval: float,
        world: Callable[[], World] | None = None,
    ) -> None:
        """`world`: an elastic attempt's world now (its resets change it); else the attempt's ranks are it."""
        self.attempt += 1
        self.interval = interval
        self.hosts = dict(sorted(hosts.items()))
        self._world = world
        self.attempt_t = now - self.origin
        self._seen.clear()
        self._exits.clear()
        self._wrote.clear()
        self._lines.clear()
        self._line_marks.clear()

    def on_output(self, rank: int, data: bytes, now: float) -> None:
        self._wrote[rank] = now
        self._lines[rank] = self._lines.get(rank, 0) + data.count(b"\n")

    def on_exit(self, rank: int, returncode: int) -> None:
        self._exits[rank] = returncode

    def on_samples(self, samples: Samples, now: float, stragglers: StragglerWatch) -> None:
        rates = stragglers.rates(now)
        t = now - self.origin
        for sample in samples.ranks:
            self._seen[sample.rank] = Seen(sample, now)
            marks = self._line_marks.setdefault(sample.rank, deque(maxlen=RATE_SAMPLES + 1))
            marks.append((now, self._lines.get(sample.rank, 0)))
            point = Point(
                t,
                sample.cpu_percent,
                sample.rss_bytes,
                sample.gpu_util_percent,
                sample.gpu_memory_bytes,
                rates.get(sample.rank),
            )
            self.series.setdefault(sample.rank, Series()).add(point)

    # -- reading it

    def samples_of_attempt(self) -> dict[int, list[Point]]:
        """Each rank's points since the current (or last) attempt started."""
        return {rank: series.points(self.attempt_t) for rank, series in self.series.items()}

    def _lines_per_s(self, rank: int) -> float | None:
        marks = self._line_marks.get(rank)
        if not marks or len(marks) < 2:
            return None
        (t0, n0), (t1, n1) = marks[0], marks[-1]
        return round((n1 - n0) / (t1 - t0), 3) if t1 > t0 else None

    def _state(self, rank: int, seen: Seen | None, age: float | None, left: bool = False) -> str:
        code = self._exits.get(rank)
        if left:
            # Left the world at a reset: told to leave (exit 0) is no failure; a lost rank says how it ended.
            if code is None:
                return "leaving"
            return "left" if code == 0 else f"left ({self._state(rank, seen, age)})"
        if code is not None:
            return f"killed {signal_name(-code)}" if code < 0 else f"exited {code}"
        if seen is None:
            return "starting"
        if seen.sample.stopped:
            return "stopped"
        if age is not None and age >= SILENT_AFTER:
            return "silent"
        return "running"

    def rows(self, now: float, stragglers: StragglerWatch) -> list[dict[str, object]]:
        """One object per rank of the current (or last) attempt's world, then one per rank that left it at a
        reset: what `distrun top` shows. `rank` is the rank's id (the console's prefix), `world_rank` its
        rank in the world now (None once it left)."""
        rates = stragglers.rates(now)
        named = {s.rank for s in stragglers.named}
        rows = []
        members: Sequence[tuple[int, str]] = list(self.hosts.items())
        gone: Mapping[int, str] = {}
        if self._world is not None:
            members, gone = self._world()
        place = {rank: position for position, (rank, _) in enumerate(members)}
        for rank, host in [*members, *sorted(gone.items())]:
            left = rank not in place
            seen = self._seen.get(rank)
            sample = seen.sample if seen is not None else _no_sample(rank)
            wrote = self._wrote.get(rank)
            age = None if wrote is None else now - wrote
            if age is None and sample.last_output_age_s is not None and seen is not None:
                age = sample.last_output_age_s + (now - seen.at)
            running = rank not in self._exits and not left
            rows.append(
                {
                    "rank": rank,
                    "host": host,
                    "world_rank": place.get(rank),
                    "left": left,
                    "state": self._state(rank, seen, age, left),
                    "steps_per_s": rates.get(rank) if running else None,
                    "lines_per_s": self._lines_per_s(rank) if running else None,
                    "cpu_percent": sample.cpu_percent if running else None,
                    "rss_bytes": sample.rss_bytes if running else None,
                    "gpu_util_percent": sample.gpu_util_percent if running else None,
                    "gpu_memory_bytes": sample.gpu_memory_bytes if running else None,
                    "last_output_age_s": None if age is None else round(age, 2),
                    "processes": sample.processes or None,
                    "straggler": rank in named,
                    "sampled_s_ago": None if seen is None else round(now - seen.at, 2),
                    "collective_issued": sample.collective_issued if running else None,
                    "collective_done": sample.collective_done if running else None,
                    "collective_name": sample.collective_name if running else None,
                    "collective_moving": sample.collective_moving if running else None,
                }
            )
        return mark_behind(rows)

    def answer(self, doing: str, now: float, stragglers: StragglerWatch) -> str:
        """`distrun top`'s answer: one JSON object, the job's state and a row per rank."""
        document = {
            "pid": os.getpid(),
            "doing": doing,
            "attempt": max(self.attempt, 0),
            "interval": self.interval,
            "ranks": self.rows(now, stragglers),
        }
        return json.dumps(document) + "\n"


def host_lines(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The console's compact line per host: lowest and median GPU utilisation (CPU without GPUs), the
    highest memory, the slowest rank."""
    from launcher.diagnose.top_view import host_summary  # the formatting, shared with `distrun top`

    by_host: dict[str, list[Mapping[str, object]]] = {}
    for row in rows:
        by_host.setdefault(str(row["host"]), []).append(row)
    return [host_summary(host, ranks) for host, ranks in by_host.items()]


def mark_behind(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each row's `collectives_behind`: how many collectives the others issued past this rank's last one,
    where it has nothing pending itself (it is outside any collective while the others wait); else None.
    None for every row while any rank's collectives move: the job is on its way, and the ranks, sampled at
    moments apart, differ by an operation or a burst."""
    issued = [v for r in rows if isinstance(v := r.get("collective_issued"), int)]
    top = 0 if any(r.get("collective_moving") for r in rows) else max(issued, default=0)
    for row in rows:
        mine, done = row.get("collective_issued"), row.get("collective_done")
        idle = isinstance(mine, int) and mine == done
        row["collectives_behind"] = top - mine if idle and isinstance(mine, int) and top > mine else None
    return rows


def _no_sample(rank: int) -> RankSample:
    """A rank's sample before its host sent any: nothing measured yet."""
    from launcher.agent.sample_messages import RankSample

    return RankSample(rank)
