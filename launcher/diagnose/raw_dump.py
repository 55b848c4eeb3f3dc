"""Every rank's stacks as read, ungrouped: what `distrun stacks`, --timeout and the report get when grouping
the stacks or their verdict failed (launcher.diagnose.isolation). The stacks that came are never lost to an
error of what reads them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from launcher.diagnose.isolation import Isolation
from launcher.diagnose.stacks import RankStacks, StackDump, ThreadStack, group_json


@dataclass(frozen=True)
class RawDump(StackDump):
    """One gathering's stacks, a rank at a time in rank order, frames as read; `failure` takes the
    verdict's place."""

    stacks: tuple[RankStacks, ...] = ()
    failure: str = ""

    @property
    def verdict(self) -> str:
        return f"none ({self.failure})"

    def _ranks(self) -> list[RankStacks]:
        return sorted(self.stacks, key=lambda s: s.rank)

    def lines(self, full: bool = False) -> list[str]:
        out: list[str] = []
        for rank in self._ranks():
            head = f"rank {rank.rank} on {rank.host}"
            if rank.error:
                out.append(f"{head}: cannot read the stacks: {rank.error}")
                continue
            out.append(f"{head}:")
            for thread in _main_first(rank.threads):
                out.append("  main thread:" if thread.main else f"  {thread.name or 'thread'}:")
                out.extend(f"    {frame.text()}" for frame in thread.frames)
        out.append(f"verdict: {self.verdict}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "time": self.time,
            "verdict": self.verdict,
            "groups": [
                group_json([rank.rank], [rank.host], rank, _main_first(rank.threads))
                for rank in self._ranks()
            ],
        }


def _main_first(threads: Iterable[ThreadStack]) -> list[ThreadStack]:
    return sorted(threads, key=lambda t: not t.main)


def gathered(
    reason: str, when: float, world_size: int, stacks: list[RankStacks], isolation: Isolation
) -> tuple[StackDump, list[str], list[str]]:
    """The gathering's dump, its console lines and its file's (every frame): grouped with a verdict, or
    where grouping, the verdict or the report's form fails, every rank's stacks as read."""
    try:
        dump = StackDump.of(reason, when, world_size, stacks)
        lines, full = dump.lines(), dump.lines(full=True)
        dump.to_json()  # the report's form, written after the job: its error must come now
        return dump, lines, full
    except Exception as err:  # the boundary of grouping and the verdict (launcher.diagnose.isolation)
        failure = isolation.failed("distrun stacks' grouping", err)
    raw = RawDump(reason, when, world_size, (), stacks=tuple(stacks), failure=failure)
    return raw, raw.lines(), raw.lines(full=True)
