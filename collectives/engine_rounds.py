"""One agreement round of a process set's engine: every rank announces the operations it submitted since the
last round, and every rank learns which operations all ranks have now submitted (Horovod's coordinator).

A round is one all_gather of a fixed, small buffer on the engine's own gloo group (a header and the first
``INLINE`` announcements of each rank), plus a second one only when some rank has more to announce. Each
rank then holds every rank's announcements, adds them to the same table in the same order, and so reaches
the same list of ready operations in the same order, with no coordinator: that order is the order in which
the operations are issued on the data group. An operation is keyed by its name (or, unnamed, by its place
in the set's sequence of ordered operations), so ranks may submit named operations in any order.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Announcement", "RoundResult", "Table", "exchange", "name_key"]

# A blocking call announces one operation: the round's first gather carries one, a burst the rest in a second.
INLINE = 1
_HEADER = 2  # (number of announcements, wants to stop)


def name_key(name: str) -> int:
    """A positive int64 naming ``name`` identically in every process; ordered operations use negative keys."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=7).digest(), "big") + 1


@dataclasses.dataclass(frozen=True)
class Announcement:
    key: int
    row: list[int]
    label: str


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What a round settled: keys that became ready (in issue order) and whether every rank wants to stop."""

    ready: list[int]
    stop: bool


class Table:
    """The announcements seen so far and not yet ready: key -> {position in the set: row}."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rows: dict[int, dict[int, list[int]]] = {}
        self.first_seen: dict[int, float] = {}
        self.labels: dict[int, str] = {}

    def add(self, position: int, key: int, row: list[int]) -> bool:
        """Record one announcement; True when every rank has now announced ``key``."""
        seen = self.rows.setdefault(key, {})
        self.first_seen.setdefault(key, time.monotonic())
        seen[position] = row
        return len(seen) == self.size

    def take(self, key: int) -> list[list[int]]:
        """Every rank's row for a ready ``key``, in set order, and forget the key."""
        seen = self.rows.pop(key)
        self.first_seen.pop(key, None)
        self.labels.pop(key, None)
        return [seen[p] for p in range(self.size)]

    def stalled(self, older_than_s: float, ranks: tuple[int, ...]) -> dict[int, list[str]]:
        """Global rank -> names it has not submitted, of operations others submitted ``older_than_s`` ago."""
        now = time.monotonic()
        missing: dict[int, list[str]] = {}
        for key, seen in self.rows.items():
            if now - self.first_seen[key] < older_than_s:
                continue
            for position, rank in enumerate(ranks):
                if position not in seen:
                    missing.setdefault(rank, []).append(self.labels.get(key, f"key {key}"))
        return missing


def _gather(buffer: torch.Tensor, size: int, group: Any, timeout: datetime.timedelta) -> list[list[int]]:
    out = torch.empty(size * buffer.numel(), dtype=torch.int64)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = fn(out, buffer, group=group, async_op=True)
    # A bounded wait: a peer that vanished or stopped answering becomes an exception, never a hang.
    work.wait(timeout)
    rows: list[list[int]] = out.view(size, buffer.numel()).tolist()
    return rows


def exchange(
    table: Table,
    mine: list[Announcement],
    *,
    stop: bool,
    group: Any,
    timeout: datetime.timedelta,
    width: int,
) -> RoundResult:
    """Run one round: announce ``mine`` (each a key and a row of ``width - 1`` values), add every rank's
    announcements to ``table`` in set order."""
    for announcement in mine:
        table.labels.setdefault(announcement.key, announcement.label)
    # One list, one tensor: the header, then the first INLINE announcements (the rest padded with -1).
    flat = [len(mine), int(stop)]
    for announcement in mine[:INLINE]:
        flat.append(announcement.key)
        flat.extend(announcement.row)
    flat.extend([-1] * (_HEADER + INLINE * width - len(flat)))
    gathered = _gather(torch.tensor(flat, dtype=torch.int64), table.size, group, timeout)
    counts = [row[0] for row in gathered]
    announced: list[list[list[int]]] = [
        [row[_HEADER + i * width : _HEADER + (i + 1) * width] for i in range(min(n, INLINE))]
        for row, n in zip(gathered, counts, strict=True)
    ]
    extra = max(counts) - INLINE
    if extra > 0:
        rest: list[int] = []
        for announcement in mine[INLINE:]:
            rest.append(announcement.key)
            rest.extend(announcement.row)
        rest.extend([-1] * (extra * width - len(rest)))
        for position_rows, row, n in zip(
            announced,
            _gather(torch.tensor(rest, dtype=torch.int64), table.size, group, timeout),
            counts,
            strict=True,
        ):
            position_rows.extend(row[i * width : (i + 1) * width] for i in range(max(0, n - INLINE)))
    ready: list[int] = []
    for p, rows in enumerate(announced):
        for row in rows:
            if table.add(p, row[0], row[1:]):
                ready.append(row[0])
    return RoundResult(ready, all(row[1] == 1 for row in gathered))
