"""One agreement round of a process set's engine: every rank announces the operations it submitted since the
last round, and every rank learns which operations all ranks have now submitted (Horovod's coordinator).

A round is one all_gather of a fixed, small buffer on the engine's own gloo group (a header and as many
announcements as fit, each row without its padding), plus a second one, as long as the longest rank's rest,
only when some rank has more to announce. Each rank then holds every rank's announcements, adds them to the
same table in the same order, and so reaches the same list of ready operations in the same order, with no
coordinator: that order is the order in which the operations are issued on the data group. An operation is
keyed by its name (or, unnamed, by its place in the set's sequence of ordered operations), so ranks may
submit named operations in any order.

An announcement may carry a payload: the bytes of a small tensor, which every rank then holds once the round
is over (a small allreduce is reduced from them, with no collective of its own). Payloads ride in the first
buffer only, behind the records, and only when every announcement of the round fits there with its payload:
a burst too large for that goes without them, to be fused into one collective instead. A burst of cached
allreduces (announced by their bits) may send its bytes too, as one block at the end of the buffer
(``collectives.engine_announce``): when every rank's block holds the same operations, the round's ready
ones, every rank reduces them from the blocks; otherwise the blocks are ignored, alike on every rank.

The first buffer's length is the same on every rank (gloo aborts a process on a size mismatch), so it cannot
follow one rank's wish within a round. It follows the rounds instead: each rank's header says how long a
first buffer it would have needed, and every rank sets the next rounds' length from the longest of the
recent rounds' wishes, the same figures everywhere. A loop that reduces 64 KB each step then pays one
gather for it from its second step on, and the buffer shrinks back once such rounds stop.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import datetime
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from collectives.engine_announce import Announcement, Block, ride_budget
from collectives.engine_cache import ResponseCache, bits_of
from collectives.errors import CollectivesError

__all__ = [
    "Riders",
    "RoundResult",
    "Table",
    "exchange",
]

# (announcements in all, wants to stop, announcements in the first buffer, their records' words, the rest's
# words: the length of the second buffer this rank needs, 0 for none; the response cache's bit vector's
# words, which follow the header; the first buffer's length this rank would have needed for all of it; how
# many cached operations' bytes ride behind the bits as one block: their byte counts follow the bits, the
# block ends the buffer)
_HEADER = 8
# The first buffer's length in words, at rest. An all_gather of 8 KB costs what one of a few hundred bytes
# does here, and holds a blocking call's announcement with a small payload, or some 80 announcements of a
# burst; it shrinks as the set grows, since every rank receives every rank's buffer.
_FIRST_WORDS = 1024
_FIRST_BYTES_ALL_RANKS = 128 * 1024
_ZERO = (0,)
# How many rounds a grown first buffer keeps its length after the last round that wanted it.
_GROWN_ROUNDS = 16


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What a round settled: keys that became ready (in issue order) and whether every rank wants to stop."""

    ready: list[int]
    stop: bool
    stopping: tuple[int, ...] = ()  # positions whose engine asked to stop (its rank is leaving)
    # Response-cache slots whose operations became ready by their bits (every rank's row is the slot's),
    # after ``ready`` in issue order.
    cached: list[int] = dataclasses.field(default_factory=list)
    # When every rank's cached operations of the round rode behind the same bits: every rank's bytes of them.
    riders: Riders | None = None


class Riders(NamedTuple):
    """Cached operations that became ready with every rank's bytes in their round: their keys in slot order,
    and every rank's block of their bytes (uint8, in set order; views of the round's buffer)."""

    keys: list[int]
    payloads: list[torch.Tensor]
    received: Words  # the buffer they are views of, lent until they have been reduced (Table.give_back)


class Table:
    """The announcements seen so far and not yet ready: key -> {position in the set: row}."""

    def __init__(self, size: int, capacity: int = 0) -> None:
        self.size = size
        self.cache = ResponseCache(size, capacity)
        self.rows: dict[int, dict[int, list[int]]] = {}
        self.first_seen: dict[int, float] = {}
        self.labels: dict[int, str] = {}
        self.payloads: dict[int, dict[int, torch.Tensor]] = {}
        # The next round's first buffer length, the same on every rank: set from every rank's header alike.
        self.words = self.rest_words = first_words(size)
        self.most_words = self.rest_words + ride_budget(size) // 8
        self._wanted: collections.deque[int] = collections.deque(maxlen=_GROWN_ROUNDS)
        # The first gather's buffers, kept from round to round while their length holds: making them is
        # two tensor calls, each tens of microseconds once the round's thread has slept.
        self._send: Words | None = None
        self._received: Words | None = None
        self._region: tuple[torch.Tensor, int, torch.dtype, torch.Tensor] | None = None

    def buffers(self) -> tuple[Words, Words]:
        """The first gather's buffers for this round: ``words`` to send, and every rank's to receive."""
        send, received = self._send, self._received
        if send is None or len(send.ints) != self.words:
            send = self._send = _words(self.words)
        if received is None or len(received.ints) != self.words * self.size:
            received = self._received = _words(self.words * self.size)
        return send, received

    def lend(self, received: Words) -> None:
        """``received`` holds payloads that outlive the round (views of its memory): the next round gathers
        into another buffer."""
        if self._received is received:
            self._received = None

    def give_back(self, received: Words) -> None:
        """``received``, lent, holds nothing anyone will read again: a later round may gather into it."""
        if self._received is None and len(received.ints) == self.words * self.size:
            self._received = received

    def block_region(self, send: Words, block: Block) -> torch.Tensor:
        """Where ``block`` goes in ``send``, its last bytes, as a tensor of the block's type: a burst rides
        the same block every step, so the region is made once (three tensor calls fewer a round)."""
        nbytes = block.nbytes
        dtype = block.tensors[0].dtype
        memo = self._region
        if memo is not None and memo[0] is send.tensor and memo[1] == nbytes and memo[2] is dtype:
            return memo[3]
        begin = (len(send.ints) - (nbytes + 7) // 8) * 8
        region = send.tensor.view(torch.uint8)[begin : begin + nbytes].view(dtype)
        self._region = (send.tensor, nbytes, dtype, region)
        return region

    def resize(self, wanted: int) -> None:
        """Set the next round's first buffer from the longest one any rank needed in this round."""
        self._wanted.append(min(wanted, self.most_words))
        self.words = max(self.rest_words, *self._wanted)

    def add(
        self,
        position: int,
        key: int,
        row: list[int],
        payload: torch.Tensor | None = None,
        now: float | None = None,
    ) -> bool:
        """Record one announcement (``now``: the round's time, when the caller has it); True when every rank
        has now announced ``key``."""
        seen = self.rows.get(key)
        if seen is None:
            seen = self.rows[key] = {}
            self.first_seen[key] = time.monotonic() if now is None else now
        seen[position] = row
        if payload is not None:
            self.payloads.setdefault(key, {})[position] = payload
        return len(seen) == self.size

    def take_payloads(self, key: int) -> list[torch.Tensor] | None:
        """Every rank's payload (uint8) for a ready ``key``, in set order, or None unless every rank sent
        one; forgets them. Call before :meth:`take`."""
        seen = self.payloads.pop(key, None)
        if seen is None or len(seen) != self.size:
            return None
        return [seen[p] for p in range(self.size)]

    def take(self, key: int) -> list[list[int]]:
        """Every rank's row for a ready ``key``, in set order, and forget the key."""
        seen = self.rows.pop(key)
        self.first_seen.pop(key, None)
        self.labels.pop(key, None)
        self.payloads.pop(key, None)
        return [seen[p] for p in range(self.size)]

    def stalled(
        self, older_than_s: float, ranks: tuple[int, ...], reporter: int | None = None
    ) -> dict[int, list[str]]:
        """Global rank -> names it has not submitted, of operations others submitted ``older_than_s`` ago.

        A rank knows the names of its own submissions only (rounds carry keys): an operation is named as its
        submitter named it, else as "an operation of rank R" after the first rank that submitted it.
        ``reporter``: only the operations whose first submitter (lowest position) is this position, which
        knows their names; every stalled operation has exactly one reporter.
        """
        now = time.monotonic()
        missing: dict[int, list[str]] = {}
        for key, seen in self.rows.items():
            if now - self.first_seen[key] < older_than_s:
                continue
            first = min(seen)
            if reporter is not None and first != reporter:
                continue
            label = self.labels.get(key) or f"an operation of rank {ranks[first]}"
            for position, rank in enumerate(ranks):
                if position not in seen:
                    missing.setdefault(rank, []).append(label)
        cache = self.cache
        for slot, own in cache.stalled(older_than_s):
            announced = [p for p in range(len(ranks)) if cache.announced_by(p, slot)]
            if not announced or (reporter is not None and announced[0] != reporter):
                continue
            label = own or f"an operation of rank {ranks[announced[0]]}"
            for position, rank in enumerate(ranks):
                if not cache.announced_by(position, slot):
                    missing.setdefault(rank, []).append(label)
        return missing

    def seen_without(self, position: int) -> Iterator[tuple[int, list[int]]]:
        """(key, a row) of every operation some rank has announced and ``position`` has not."""
        for key, seen in self.rows.items():
            if seen and position not in seen:
                yield key, next(iter(seen.values()))
        cache = self.cache
        for slot, key, _ in list(cache.waiting()):
            if not cache.announced_by(position, slot):
                yield key, cache.full_row(slot)


class Words(NamedTuple):
    """A gather's buffer of int64 words: ``ints``, read and written from Python (slicing it costs a round far
    less than tensor calls do), and the same memory as a tensor, for the collective and the payloads."""

    ints: array.array[int]
    tensor: torch.Tensor


def _words(count: int) -> Words:
    ints = array.array("q", _ZERO) * count
    return Words(ints, torch.frombuffer(ints, dtype=torch.int64))  # the tensor keeps the array alive


def _gather(buffer: torch.Tensor, out: torch.Tensor, group: Any, timeout: datetime.timedelta) -> None:
    """Every rank's ``buffer``, in set order, into ``out`` (1-d, the set's size times as long)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = fn(out, buffer, group=group, async_op=True)
    # A bounded wait: a peer that vanished or stopped answering becomes an exception, never a hang.
    work.wait(timeout)


def first_words(size: int) -> int:
    """The first buffer's length for a set of ``size`` ranks."""
    return max(64, min(_FIRST_WORDS, _FIRST_BYTES_ALL_RANKS // (8 * size)))


def _records(mine: list[Announcement]) -> list[list[int]]:
    """Each announcement as (key, n, its row's n values, payload bytes, payload offset): rows come without
    their trailing -1s (their padding), restored on arrival; the payload's two words are -1 until placed."""
    return [[a.key, len(a.row), *a.row, -1, -1] for a in mine]


def _fit(records: list[list[int]], words: int) -> tuple[int, int]:
    """How many records fit in ``words`` (the first buffer's room after its header and bits), and the words
    they take there."""
    used = 0
    count = 0
    room = words
    for record in records:
        if used + len(record) > room:
            break
        used += len(record)
        count += 1
    return count, used


def _payload_words(mine: list[Announcement]) -> int:
    return sum((a.payload.nbytes + 7) // 8 for a in mine if a.payload is not None)


def _pack_first(  # noqa: PLR0917 (one buffer's parts)
    mine: list[Announcement],
    records: list[list[int]],
    header: list[int],
    bits: int,
    send: Words,
    block: tuple[Block, torch.Tensor] | None,
) -> None:
    """Write the first buffer into ``send``: ``header``, the bits, the ``block``'s byte counts, then the
    first ``header[2]`` records, then (from the back) the block's bytes (into its region, the last of
    ``send``), or every announcement's payload if all the announcements are here and their payloads fit
    behind the records. The words in between are left as they were: nobody reads them."""
    count, used, bit_words = header[2], header[3], header[5]
    start = _HEADER + bit_words + header[7]
    placed: list[tuple[int, int, torch.Tensor]] = []
    tail = len(send.ints)
    if count == len(mine):
        for index, announcement in enumerate(mine):
            payload = announcement.payload
            if payload is None:
                continue
            tail -= (payload.nbytes + 7) // 8
            if tail < start + used:
                placed = []
                break
            placed.append((index, tail, payload))
    for index, offset, payload in placed:
        record = records[index]
        record[-2], record[-1] = payload.nbytes, offset
    flat = array.array("q", header)
    if bit_words:
        flat.frombytes(bits.to_bytes(bit_words * 8, "little"))
    if block is not None:
        flat.extend(block[0].sizes)
    for record in records[:count]:
        flat.extend(record)
    send.ints[: len(flat)] = flat  # as long as the slice: the array, exported to the tensor, cannot resize
    if block is not None:
        tensors = block[0].tensors
        # One call for all of them, into the buffer (a set, not all() over a generator: a call per tensor).
        torch.cat(
            tensors if {t.dim() for t in tensors} == {1} else [t.view(-1) for t in tensors], out=block[1]
        )
    for _, offset, payload in placed:
        send.tensor[offset:].view(torch.uint8)[: payload.nbytes].copy_(payload.reshape(-1).view(torch.uint8))


def _unpack(
    gathered: Words, base: int, ints: list[int], count: int, width: int
) -> list[tuple[int, list[int], torch.Tensor | None]]:
    """One rank's (key, row, payload bytes or None) from its records ``ints`` (its words start at ``base``
    in ``gathered``, where its payloads lie)."""
    entries: list[tuple[int, list[int], torch.Tensor | None]] = []
    at = 0
    padding = [-1] * (width - 1)
    data: torch.Tensor | None = None
    for _ in range(count):
        n = ints[at + 1]
        end = at + 2 + n
        row = ints[at + 2 : end]
        row += padding[n:]
        nbytes = ints[end]
        payload = None
        if nbytes >= 0:
            if data is None:
                data = gathered.tensor.view(torch.uint8)
            start = (base + ints[end + 1]) * 8
            payload = data[start : start + nbytes]
        entries.append((ints[at], row, payload))
        at = end + 2
    return entries


def exchange(
    table: Table,
    mine: list[Announcement],
    *,
    stop: bool,
    group: Any,
    timeout: datetime.timedelta,
    width: int,
    bits: int = 0,
    block: Block | None = None,
) -> RoundResult:
    """Run one round: announce ``mine`` (each a key and a row of ``width - 1`` values, and maybe a payload)
    and ``bits``, the response cache's slots of the operations announced by their bit, with ``block``, their
    bytes, if it fits; add every rank's announcements to ``table`` in set order."""
    labels = table.labels
    for announcement in mine:
        if announcement.key not in labels:
            labels[announcement.key] = announcement.label
    cache = table.cache
    bit_words = cache.words
    records = _records(mine)
    words = table.words
    block_words = 0 if block is None else len(block.sizes) + (block.nbytes + 7) // 8
    if block_words > words - _HEADER - bit_words:
        block = None  # it rides from the next rounds on, once the first buffer has grown (``wanted``)
    sizes = 0 if block is None else len(block.sizes)
    inline, inline_words = _fit(records, words - _HEADER - bit_words - sizes)
    rest: list[int] = []
    for record in records[inline:]:
        rest.extend(record)
    wanted = _HEADER + bit_words + inline_words + len(rest) + _payload_words(mine) + block_words
    header = [len(mine), int(stop), inline, inline_words, len(rest), bit_words, wanted, sizes]
    send, gathered = table.buffers()
    region = None if block is None else (block, table.block_region(send, block))
    _pack_first(mine, records, header, bits, send, region)
    _gather(send.tensor, gathered.tensor, group, timeout)
    ints = gathered.ints
    bases = range(0, table.size * words, words)  # where each rank's words start
    start = _HEADER + bit_words
    headers = [ints[b : b + _HEADER].tolist() for b in bases]
    table.resize(max(h[6] for h in headers))
    if any(h[5] != bit_words for h in headers):
        raise CollectivesError(
            "the ranks' response caches differ in size: set HOROVOD_CACHE_CAPACITY alike on every rank"
        )
    announced = [
        _unpack(gathered, b, ints[b + start + h[7] : b + start + h[7] + h[3]].tolist(), h[2], width)
        if h[2]
        else []
        for b, h in zip(bases, headers, strict=True)
    ]
    if any(payload is not None for entries in announced for _, _, payload in entries):
        table.lend(gathered)
    vectors: list[int] = []
    if bit_words:
        pending = cache.pending
        for p, b in enumerate(bases):
            vector = int.from_bytes(ints[b + _HEADER : b + start].tobytes(), "little")
            vectors.append(vector)
            if vector:
                pending[p] |= vector
    longest = max(h[4] for h in headers)
    if longest > 0:
        # A rare second gather: its buffers are made for it.
        rest.extend([-1] * (longest - len(rest)))
        sent = array.array("q", rest)
        more = _words(table.size * longest)
        _gather(torch.frombuffer(sent, dtype=torch.int64), more.tensor, group, timeout)
        for p, h in enumerate(headers):
            b = p * longest
            announced[p].extend(_unpack(more, b, more.ints[b : b + h[4]].tolist(), h[0] - h[2], width))
    ready: list[int] = []
    now = time.monotonic()
    add = table.add
    slot_of = cache.slot_of
    for p, entries in enumerate(announced):
        for key, row, payload in entries:
            slot = slot_of.get(key) if slot_of else None
            if slot is not None:
                if row == cache.full_row(slot):
                    # The cached row announced in full (its payload rode along): the same as its bit.
                    cache.pending[p] |= 1 << slot
                    if payload is not None:
                        table.payloads.setdefault(key, {})[p] = payload
                    continue
                # Another row under a cached name: every rank drops the slot in this same round, and the
                # bits set for it become rows again, for the verdict to compare.
                for position, cached_row in cache.drop(key):
                    if add(position, key, cached_row, None, now):
                        ready.append(key)
            if add(p, key, row, payload, now):
                ready.append(key)
    for key in ready:
        # Agreed with one row everywhere: announced by its bit from now on (the same slot on every rank).
        if key > 0:
            cache.admit(key, [table.rows[key][p] for p in range(table.size)], table.labels.get(key, ""))
    cached = cache.take_ready(now) if bit_words else []
    riders = _riders(table, gathered, headers, vectors, cached) if headers[0][7] else None
    stopping = tuple(p for p, h in enumerate(headers) if h[1] == 1)
    return RoundResult(ready, len(stopping) == len(headers), stopping, cached, riders)


def _riders(
    table: Table, gathered: Words, headers: list[list[int]], vectors: list[int], cached: list[int]
) -> Riders | None:
    """Every rank's bytes of the cached operations ready in this round, when every rank sent them in one
    block behind the same bits (every rank decides alike: it reads the same buffers); else None, and they
    are reduced by a collective of their own."""
    count = headers[0][7]
    if any(h[7] != count for h in headers) or any(v != vectors[0] for v in vectors):
        return None
    if cached != bits_of(vectors[0]):
        return None
    ints = gathered.ints
    words = len(ints) // table.size
    bases = range(0, len(ints), words)
    start = _HEADER + table.cache.words
    sizes = ints[start : start + count]
    if any(ints[b + start : b + start + count] != sizes for b in bases):
        return None
    nbytes = sum(sizes)
    data = gathered.tensor.view(torch.uint8)
    begins = [(b + words - (nbytes + 7) // 8) * 8 for b in bases]
    table.lend(gathered)  # the payloads are views of it, and may wait behind a turn for a later round
    keys = table.cache.keys
    # A round whose every rank sent a block has no records, so no other payload is a view of this buffer.
    return Riders(
        [keys[slot] for slot in cached], [data[begin : begin + nbytes] for begin in begins], gathered
    )
