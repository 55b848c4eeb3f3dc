"""Live samples of every running rank: its whole process tree's CPU and memory, its GPUs, its last output.

Every `interval` seconds (StartRequest.sample_interval; 0: never) the agent reads, for each running rank, the
process tree below it from /proc (the rank and whatever it started: DataLoader workers, compile workers):
CPU percent over the interval and resident memory, summed; GPU utilisation and memory from NVML where the
host has it (launcher.agent.nvml; null fields where not); and how long ago the rank last wrote. One SAMPLES
frame carries every rank of the host.

Cheap on purpose (docs/performance.md has the figure): one /proc/PID/stat per process and the children
lists of its threads, no scan of /proc where the kernel lists children.

Stdlib-only and Python 3.7 compatible: it is shipped to remote hosts with the agent.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from launcher.agent.nvml import Nvml, open_nvml
from launcher.agent.progress import ask, read, summary
from launcher.agent.reaper import descendants

if TYPE_CHECKING:  # loaded with the first sample: a job that ends before it never builds them
    from launcher.agent.sample_messages import Samples

_TICKS = os.sysconf("SC_CLK_TCK") if "SC_CLK_TCK" in os.sysconf_names else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if "SC_PAGE_SIZE" in os.sysconf_names else 4096
# Fields of /proc/PID/stat after the command's ")" (the state is field 3 there, index 0 here).
_STATE, _UTIME, _STIME, _CUTIME, _CSTIME, _RSS = 0, 11, 12, 13, 14, 21


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, CPU ticks of it and its waited-for children, resident pages); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) <= _RSS:
        return None
    ticks = sum(int(fields[i]) for i in (_UTIME, _STIME, _CUTIME, _CSTIME))
    return fields[_STATE].decode(), ticks, int(fields[_RSS])


def tree(root: int) -> list[int]:
    """`root` and every process below it, parents first (zombies too: their CPU time is still theirs)."""
    return [root, *descendants(root, zombies=True)]


class Sampler:
    """One attempt's sampling on one host. `wrote` as output comes; `due`/`sample` from the agent's loop."""

    def __init__(
        self, interval: float, now: float, nvml: Any = None, progress_dir: str | None = None
    ) -> None:
        self.interval = interval
        self.next_at: float | None = now if interval > 0 else None
        self._last: dict[int, tuple[float, int]] = {}  # rank -> (when, CPU ticks of its tree then)
        self._wrote: dict[int, float] = {}
        self._nvml = nvml  # opened at the first sample: a job that never samples never loads NVML
        self._nvml_tried = nvml is not None
        # The agent's dump directory, where ranks answer for their collectives (launcher.agent.progress).
        self.progress_dir = progress_dir  # where the ranks answer with their collectives (agent.progress)

    def wrote(self, rank: int, now: float) -> None:
        self._wrote[rank] = now

    def due(self, now: float) -> bool:
        return self.next_at is not None and now >= self.next_at

    def take(self, running: dict[int, int], now: float) -> Samples | None:
        """`sample`, where an error of it becomes a Samples saying it (the boundary of sampling: the
        launcher says it once and the ranks keep their last samples; the agent and the job run on)."""
        try:
            return self.sample(running, now)
        except Exception as err:
            if self.next_at is not None and self.next_at <= now:
                self.next_at = now + max(self.interval, 1.0)
            from launcher.agent.sample_messages import Samples

            text = " ".join(str(err).split())
            return Samples(self.interval, error=f"sampling failed: {type(err).__name__}: {text}")

    def sample(self, running: dict[int, int], now: float) -> Samples | None:
        """Every running rank (rank -> pid) now; None on the first call of an attempt, which only takes the
        CPU counters that the next sample's percentages start from."""
        assert self.next_at is not None
        # From the due time, not from now: a late loop does not make the pace drift.
        self.next_at = max(self.next_at + self.interval, now)
        first = not self._last
        trees = {rank: tree(pid) for rank, pid in running.items()}
        readings = {}
        for rank, pids in trees.items():
            state, ticks, pages = "", 0, 0
            for pid in pids:
                stat = _stat(pid)
                if stat is None:
                    continue
                if pid == pids[0]:
                    state = stat[0]
                ticks += stat[1]
                pages += stat[2]
            readings[rank] = (state, ticks, pages)
        if first:
            self._last = {rank: (now, ticks) for rank, (_, ticks, _) in readings.items()}
            return None
        from launcher.agent.sample_messages import RankSample, Samples

        gpus = self._gpus(trees)
        ranks = []
        for rank, (state, ticks, pages) in readings.items():
            before = self._last.get(rank)
            self._last[rank] = (now, ticks)
            cpu = None
            if before is not None and now > before[0]:
                # A process reaped outside the tree takes its ticks along: never below zero.
                cpu = max(0.0, (ticks - before[1]) / _TICKS / (now - before[0]) * 100.0)
            wrote = self._wrote.get(rank)
            util, memory = gpus.get(rank, (None, None))
            ranks.append(
                RankSample(
                    rank=rank,
                    cpu_percent=None if cpu is None else round(cpu, 1),
                    rss_bytes=pages * _PAGE,
                    gpu_util_percent=None if util is None else round(util, 1),
                    gpu_memory_bytes=memory,
                    last_output_age_s=None if wrote is None else round(now - wrote, 2),
                    stopped=state in ("T", "t"),
                    processes=len(trees[rank]),
                    **self._collectives(trees[rank]),
                )
            )
        return Samples(interval=self.interval, ranks=ranks)

    def _collectives(self, pids: list[int]) -> dict[str, Any]:
        """The answer to the last sample's ask (one interval old), and the ask for the next sample's."""
        if self.progress_dir is None:
            return {}
        for pid in pids:
            if ask(self.progress_dir, pid):
                return summary(read(self.progress_dir, pid))
        return {}

    def _gpus(self, trees: dict[int, list[int]]) -> dict[int, tuple[float | None, int | None]]:
        if not self._nvml_tried:
            self._nvml_tried = True
            self._nvml = open_nvml()
        nvml: Nvml | None = self._nvml
        if nvml is None:
            return {}
        try:
            return nvml.usage(trees)
        except (OSError, ValueError):
            return {}
