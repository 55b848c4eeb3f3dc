"""The few lines that say how a job ended (pure)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable

from launcher.core.result import HostLost, Outcome, RankFailed, Signalled, TimedOut, describe_exit


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


def _stopped(ranks: tuple[int, ...], what: str) -> str:
    """`; ranks stopped: 0-3`, or nothing when no rank was left to stop (never a list reading "none")."""
    return f"; {what}: {format_ranks(ranks)}" if ranks else ""


def _ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def teardown_abort(outcome: RankFailed) -> list[str]:
    """A rank that aborted once every other rank had finished well: its work is most likely done, and torch
    aborted in its interpreter's shutdown. A script that leaves its process group to the interpreter's exit
    has one rank die so in some runs (with torchrun too): `terminate called without an active exception`.

    A peer whose exit 0 was heard just after the abort (`exited`: it ended on its own, not by the stop) counts
    as done too: exits do not always reach distrun in the order the ranks ended (a loaded run heard rank 0's
    exit after rank 1's abort, which the test's rank 1 had held until rank 0 was gone)."""
    failed = outcome.failure
    peers_fine = all(other.returncode == 0 for other in outcome.exited)
    peers_ended = outcome.peers_done or outcome.exited  # none: it was alone, nothing says its work was done
    if failed.returncode != -signal.SIGABRT or outcome.stopped or not peers_fine or not peers_ended:
        return []
    return [
        f"rank {failed.rank} aborted (SIGABRT) after every other rank had exited 0: most likely torch's "
        "abort at interpreter exit (`terminate called without an active exception`), which a script that "
        "leaves its process group to be torn down then can meet; call "
        "torch.distributed.destroy_process_group() at the end of the script (the exit code stays "
        f"{failed.exit_code})"
    ]


def summarize(outcome: Outcome, stderr_tail: Callable[[int], list[str]]) -> list[str]:
    """Lines for the console when the attempt did not simply succeed; [] when it did."""
    if isinstance(outcome, RankFailed):
        failed = outcome.failure
        # Only ranks that were still running were stopped; one that had already exited 0 was not, nor one
        # that ended on its own as the stop began (named with its exit, ranks of the same exit together).
        by_exit: dict[str, list[int]] = {}
        for ended in outcome.exited:
            by_exit.setdefault(describe_exit(ended), []).append(ended.rank)
        own = "".join(f"; {_ranks(ranks)} {said}" for said, ranks in by_exit.items())
        others = list(outcome.stopped)
        lines = [
            f"rank {failed.rank} (host {failed.host}) {describe_exit(failed)}{own}"
            + (f"; stopped {_ranks(others)}" if others else "")
        ]
        tail = stderr_tail(failed.rank)
        if tail:
            lines.append(f"last stderr lines of rank {failed.rank}:")
            lines.extend(f"  {line}" for line in tail)
        return lines + teardown_abort(outcome)
    if isinstance(outcome, TimedOut):
        stopped = _stopped(outcome.stopped, "ranks still running were stopped")
        return [f"timed out after {outcome.timeout:g}s{stopped}"]
    if isinstance(outcome, Signalled):
        return [f"stopped by {outcome.signal_name}{_stopped(outcome.stopped, 'ranks stopped')}"]
    if isinstance(outcome, HostLost):
        if outcome.ours:
            return [f"host {outcome.host} stopped its ranks: {outcome.detail}"]
        return [f"lost host {outcome.host} ({outcome.detail}); stopped every other host"]
    return []
