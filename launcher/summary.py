"""The few lines that say how a job ended (pure)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable

from launcher.result import RankExit, RunResult


def format_ranks(ranks: Iterable[int]) -> str:
    """`0,1,2,5` -> `0-2,5`."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def describe_exit(ended: RankExit) -> str:
    if ended.returncode < 0:
        try:
            name = signal.Signals(-ended.returncode).name
        except ValueError:
            name = f"signal {-ended.returncode}"
        return f"was killed by {name} (exit code {ended.exit_code})"
    return f"exited with code {ended.returncode}"


def summarize(result: RunResult, stderr_tail: Callable[[int], list[str]]) -> list[str]:
    """Lines for the console when the job did not simply succeed; [] when it did."""
    if result.reason == "failure" and result.first_failure is not None:
        failed = result.first_failure
        # Only ranks that were still running were stopped; one that had already exited 0 was not.
        others = list(result.still_running)
        lines = [
            f"rank {failed.rank} (host {failed.host}) {describe_exit(failed)}"
            + (
                f"; stopped {'rank' if len(others) == 1 else 'ranks'} {format_ranks(others)}"
                if others
                else ""
            )
        ]
        tail = stderr_tail(failed.rank)
        if tail:
            lines.append(f"last stderr lines of rank {failed.rank}:")
            lines.extend(f"  {line}" for line in tail)
        return lines
    if result.reason == "timeout":
        running = format_ranks(result.still_running) or "none"
        return [f"timed out after {result.timeout:g}s; ranks still running were stopped: {running}"]
    if result.reason == "signal":
        return [
            f"stopped by {result.signal_name}; ranks stopped: {format_ranks(result.still_running) or 'none'}"
        ]
    if result.reason == "host-lost":
        return [f"lost host {result.lost_host} ({result.lost_detail}); stopped every other host"]
    return []
