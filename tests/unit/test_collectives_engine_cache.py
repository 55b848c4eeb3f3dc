"""The engine's response cache: named operations agreed before are announced by a bit, and a rank that
announces such a name with another row still reaches a verdict on every rank (two ranks simulated by two
threads, each with its own table, exchanging through a fake all_gather)."""

from __future__ import annotations

import datetime
import random
import threading
import time
from typing import Any

import pytest
import torch

from collectives import engine_rounds
from collectives.engine_announce import Announcement, announce, name_key
from collectives.engine_cache import Marks, ResponseCache, bits_of, mask_of
from collectives.engine_rounds import RoundResult, Table
from collectives.engine_values import Fusion
from collectives.negotiation import ROW, Call, Kind, row_of
from collectives.reduce_op import ReduceOp

TIMEOUT = datetime.timedelta(seconds=5)


def test_bit_vectors_round_trip() -> None:
    shuffler = random.Random(3)
    for count in (0, 1, 5, 64, 65, 1000):
        slots = sorted(shuffler.sample(range(1024), count))
        mask = mask_of(slots, 16)
        assert mask == sum(1 << slot for slot in slots)
        assert bits_of(mask) == slots
    for low, count in ((0, 1), (0, 1000), (3, 1), (5, 70), (1023, 1)):  # one run of set bits
        slots = list(range(low, low + count))
        assert bits_of(mask_of(slots, 16)) == slots


def _no_issue(*args: object) -> Any:
    raise AssertionError("the round itself issues nothing")


class _Entry:
    """What ``announce`` reads of an engine's entry."""

    def __init__(self, name: str, shape: tuple[int, ...], tensor: torch.Tensor | None = None) -> None:
        self.call = Call(Kind.ALLREDUCE, name, torch.float32, "cpu", ReduceOp.SUM, shape=shape)
        self.key = name_key(name)
        self.fusion: Fusion | None = None
        if tensor is not None:  # an allreduce that may ride: its bytes are the tensor's
            self.fusion = Fusion("f32", tensor, _no_issue, tensor.nbytes, _no_issue, _no_issue)
        self.row: list[int] | None = None

    def announced_row(self) -> list[int]:
        return row_of(self.call)

    def announcement(self) -> Announcement:
        return Announcement(self.key, row_of(self.call), self.call.name or "", None)


def _rounds(
    tables: list[Table], entries: list[list[_Entry]], monkeypatch: pytest.MonkeyPatch, ride_bytes: int = 0
) -> list[RoundResult]:
    """One round of two ranks: each announces its entries (cached ones by their bit)."""
    barrier = threading.Barrier(2)
    buffers: list[torch.Tensor | None] = [None, None]
    results: list[RoundResult | None] = [None, None]
    position = threading.local()

    def gather(buffer: torch.Tensor, out: torch.Tensor, group: object, timeout: object) -> None:
        buffers[position.index] = buffer
        barrier.wait()
        out.copy_(torch.cat([b for b in buffers if b is not None]))
        barrier.wait()

    def rank(index: int) -> None:
        position.index = index
        mine, bits, block = announce(tables[index].cache, entries[index], ride_bytes=ride_bytes)
        results[index] = engine_rounds.exchange(
            tables[index],
            mine,
            stop=False,
            group=None,
            timeout=TIMEOUT,
            width=1 + ROW,
            bits=bits,
            block=block,
        )

    monkeypatch.setattr(engine_rounds, "_gather", gather)
    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _take(table: Table, result: RoundResult) -> None:
    for key in result.ready:
        table.take(key)


def test_an_operation_agreed_once_goes_by_its_bit_and_both_ranks_find_it_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tables = [Table(2, 64), Table(2, 64)]
    grads = [[_Entry(f"grad.{i}", (4,)) for i in range(3)] for _ in range(2)]
    first = _rounds(tables, grads, monkeypatch)
    assert [r.ready for r in first] == [[e.key for e in grads[0]]] * 2 and all(not r.cached for r in first)
    for table, result in zip(tables, first, strict=True):
        _take(table, result)
    assert tables[0].cache.slot_of == tables[1].cache.slot_of and len(tables[0].cache.slot_of) == 3
    mine, bits, block = announce(tables[0].cache, grads[0], ride_bytes=0)
    assert mine == [] and bits_of(bits) == [0, 1, 2] and block is None
    second = _rounds(tables, grads, monkeypatch)
    assert [r.cached for r in second] == [[0, 1, 2], [0, 1, 2]] and all(not r.ready for r in second)
    assert all(table.rows == {} for table in tables)


def test_another_row_under_a_cached_name_drops_the_slot_on_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tables = [Table(2, 64), Table(2, 64)]
    same = [[_Entry("grad.w", (4,))] for _ in range(2)]
    for table, result in zip(tables, _rounds(tables, same, monkeypatch), strict=True):
        _take(table, result)
    # Rank 0 announces the cached row by its bit, rank 1 the same name with another shape, in full.
    changed = [[_Entry("grad.w", (4,))], [_Entry("grad.w", (5,))]]
    results = _rounds(tables, changed, monkeypatch)
    key = name_key("grad.w")
    assert [r.ready for r in results] == [[key], [key]] and all(not r.cached for r in results)
    for table in tables:
        assert table.cache.slot_of == {}
        rows = table.take(key)
        assert rows[0] != rows[1]  # the verdict sees both rows: a MismatchError on every rank


def test_a_cached_operation_one_rank_has_not_announced_shows_in_the_stall_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tables = [Table(2, 64), Table(2, 64)]
    same = [[_Entry("grad.b", (2,))] for _ in range(2)]
    for table, result in zip(tables, _rounds(tables, same, monkeypatch), strict=True):
        _take(table, result)
    results = _rounds(tables, [[_Entry("grad.b", (2,))], []], monkeypatch)
    assert all(not r.ready and not r.cached for r in results)
    for table in tables:
        assert table.stalled(0.0, (7, 8)) == {8: ["grad.b"]}
        assert list(table.seen_without(1)) == [(name_key("grad.b"), table.cache.full_row(0))]
    results = _rounds(tables, [[], [_Entry("grad.b", (2,))]], monkeypatch)
    assert [r.cached for r in results] == [[0], [0]]
    assert all(table.stalled(0.0, (7, 8)) == {} for table in tables)


def test_cached_operations_ride_behind_their_bits_when_every_rank_sends_the_same_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rank's bytes of a burst of cached operations come back in one block a rank, in slot order
    whatever the order of submission; when the ranks' bits differ, nobody uses the blocks."""
    tables = [Table(2, 64), Table(2, 64)]

    def grads(rank: int, count: int = 5) -> list[_Entry]:
        return [_Entry(f"g.{i}", (i + 1,), torch.full((i + 1,), 10.0 * rank + i)) for i in range(count)]

    for table, result in zip(tables, _rounds(tables, [grads(0), grads(1)], monkeypatch), strict=True):
        _take(table, result)
    burst = [grads(0), grads(1)[::-1]]  # rank 1 submits them the other way round
    results = _rounds(tables, burst, monkeypatch, ride_bytes=1024)
    keys = [e.key for e in grads(0)]
    assert [r.cached for r in results] == [[0, 1, 2, 3, 4]] * 2
    for result in results:
        assert result.riders is not None and result.riders.keys == keys
        blocks = [p.view(torch.float32) for p in result.riders.payloads]
        assert [b.tolist() for b in blocks] == [
            [0.0, 1.0, 1.0, 2.0, 2.0, 2.0] + [3.0] * 4 + [4.0] * 5,
            [10.0, 11.0, 11.0, 12.0, 12.0, 12.0] + [13.0] * 4 + [14.0] * 5,
        ]
    # Rank 1 has only four of them this round: the four go by their bits and a collective, as before.
    results = _rounds(tables, [grads(0), grads(1, 4)], monkeypatch, ride_bytes=1024)
    assert [r.cached for r in results] == [[0, 1, 2, 3]] * 2 and all(r.riders is None for r in results)
    # Too many bytes for the round: bits only.
    results = _rounds(tables, [[], grads(1, 5)[4:]], monkeypatch, ride_bytes=1024)
    results = _rounds(tables, [grads(0), grads(1)], monkeypatch, ride_bytes=16)
    assert [r.cached for r in results] == [[0, 1, 2, 3, 4]] * 2 and all(r.riders is None for r in results)


def _cached(names: list[str]) -> tuple[ResponseCache, list[_Entry]]:
    """A cache holding ``names`` (one row each, the same on both ranks) and an entry of each."""
    cache = ResponseCache(2, 64)
    entries = [_Entry(name, (4,)) for name in names]
    for entry in entries:
        row = entry.announced_row()
        cache.admit(entry.key, [row, row], entry.call.name or "")
    return cache, entries


def test_marks_made_at_submission_stand_for_a_round_that_walks_every_entry() -> None:
    cache, entries = _cached([f"grad.{i}" for i in range(8)])
    marks = Marks(cache)
    for entry in entries:
        marks.mark(entry.key, entry.announced_row())
    marked = marks.take(len(entries))
    assert marked is not None and bits_of(marked) == list(range(8))
    assert announce(cache, entries, 0, marked) == announce(cache, entries, 0) == ([], marked, None)
    assert marks.take(0) is None  # taken: the next round starts afresh


def test_marks_are_not_used_when_an_entry_was_not_marked_or_a_slot_was_dropped_since() -> None:
    cache, entries = _cached([f"grad.{i}" for i in range(8)])
    marks = Marks(cache)
    for entry in entries[:-1]:
        marks.mark(entry.key, entry.announced_row())
    assert marks.take(len(entries)) is None  # one entry the round must look at itself
    marks.mark(entries[0].key, [1, 2, 3])  # another row: no slot
    assert marks.take(1) is None
    for entry in entries[1:]:
        marks.mark(entry.key, entry.announced_row())
    cache.drop(entries[0].key)
    assert marks.take(len(entries) - 1) is None  # a slot found before the drop may be the dropped one
    marks.mark(entries[1].key, entries[1].announced_row())
    assert marks.take(1) == 1 << 1


def test_a_slot_waits_from_the_round_in_which_the_first_rank_announced_it() -> None:
    cache, _ = _cached(["a", "b", "c"])
    now = time.monotonic()
    cache.pending = [0b011, 0]
    assert cache.take_ready(now - 100) == []
    cache.pending[0] |= 0b100
    assert cache.take_ready(now) == []
    assert list(cache.stalled(50)) == [(0, "a"), (1, "b")]
    assert [slot for slot, _, _ in cache.waiting()] == [0, 1, 2]
    cache.pending[1] = 0b001
    assert cache.take_ready(now) == [0]
    assert list(cache.stalled(50)) == [(1, "b")] and cache.announced_by(0, 1) and not cache.announced_by(1, 1)
    cache.pending[1] = 0b110
    assert cache.take_ready(now) == [1, 2]
    assert list(cache.waiting()) == [] and cache.pending == [0, 0]
