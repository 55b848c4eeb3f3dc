"""The engine's response cache (Horovod's): named operations seen before are announced by a bit, not a row.

Once a named operation has been agreed with the same row on every rank, every rank gives it the same slot
(slots are handed out in the order the rounds make operations ready, which every rank shares). From then on a
rank that submits it again with that row announces it by setting the slot's bit in its round's buffer: a
step of a thousand gradients seen before costs each rank a bit vector of 16 words, and the round finds what
every rank has announced by and-ing the ranks' vectors (Python ints), with no row sent, unpacked, tabled or
compared per operation.

A rank that submits the name with another row (a new shape, type or op) announces the row in full: every
rank sees it in the same round, drops the slot, and turns the bits already set for it back into rows, so the
verdict sees every rank's row and raises :class:`MismatchError` on all of them as before. The slots are never
reused, and once ``capacity`` of them (``HOROVOD_CACHE_CAPACITY``, 1024 by default; 0 turns the cache off)
have been handed out, further names go by their rows.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator

__all__ = ["Marks", "ResponseCache", "bits_of", "capacity_from_env", "flags_mask", "mask_of"]

DEFAULT_CAPACITY = 1024

_DIGITS = bytes.maketrans(b"01", b"\x00\x01")


def capacity_from_env() -> int:
    raw = os.environ.get("HOROVOD_CACHE_CAPACITY", "").strip()
    return max(0, int(raw)) if raw else DEFAULT_CAPACITY


def bits_of(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    if not mask:
        return []
    low = (mask & -mask).bit_length() - 1
    run = mask >> low
    if run & (run + 1) == 0:
        # One run of set bits (a step's cached operations, agreed together): no digit to read.
        return list(range(low, low + run.bit_length()))
    # Through its binary digits: a shift or a mask of a 1024-bit int allocates one, per bit.
    digits = bin(mask)[:1:-1]
    if mask.bit_count() > 64:
        # In C: the digits as 0/1 bytes select from the positions, with no Python step per bit.
        return list(itertools.compress(range(len(digits)), digits.encode().translate(_DIGITS)))
    out: list[int] = []
    at = digits.find("1")
    while at >= 0:
        out.append(at)
        at = digits.find("1", at + 1)
    return out


def mask_of(slots: list[int], words: int) -> int:
    """The bit vector of ``slots``."""
    if not slots:
        return 0
    flags = bytearray(words * 64)
    for slot in slots:
        flags[slot] = 49  # "1"
    return flags_mask(flags)


def flags_mask(flags: bytearray) -> int:
    """The bit vector of ``flags``: one byte a slot, 49 (``"1"``) where set, 0 elsewhere."""
    return int(flags.replace(b"\x00", b"0")[::-1], 2)


class ResponseCache:
    """Slots of named operations agreed with one row on every rank, and which ranks have announced each."""

    def __init__(self, size: int, capacity: int) -> None:
        self.size = size
        self.capacity = capacity
        self.words = (capacity + 63) // 64  # the bit vector's length in int64 words
        self.slot_of: dict[int, int] = {}
        self.keys: list[int] = []
        # Per slot: the row as its submitters announce it, without its trailing -1s (``row_of``).
        self.rows: list[list[int]] = []
        self.labels: list[str] = []
        # Per slot: every rank's row (the same list, size times), shared by every use of the slot.
        self.all_rows: list[list[list[int]]] = []
        # Per position in the set: the slots it has announced that are not ready yet.
        self.pending = [0] * size
        # The slots some rank has announced and not every rank, and since when: (time, the slots that began
        # to wait in that round), oldest first; a vector a round, not an entry a slot.
        self.waiting_mask = 0
        self._since: list[tuple[float, int]] = []
        self.drops = 0  # slots dropped so far: a slot found before a drop may be gone

    def slot(self, key: int, row: list[int]) -> int | None:
        """The slot of ``key`` if it is cached with exactly ``row``."""
        slot = self.slot_of.get(key)
        if slot is None:
            return None
        cached = self.rows[slot]
        if cached is not row:
            if cached != row:
                return None
            # The same row: keep the submitter's list, so the next step compares identities.
            self.rows[slot] = row
        return slot

    def admit(self, key: int, rows: list[list[int]], label: str) -> None:
        """Give ``key`` the next slot, when every rank's row is the same (called in ready order)."""
        if len(self.keys) >= self.capacity or key <= 0 or key in self.slot_of:
            return
        first = rows[0]
        for row in rows:
            if row != first:
                return
        announced = list(first)
        while announced and announced[-1] == -1:
            announced.pop()
        slot = len(self.keys)
        self.keys.append(key)
        self.rows.append(announced)
        self.labels.append(label)
        self.all_rows.append([first] * self.size)
        # Last: a submitter's thread may look the key up meanwhile (Marks), and finds the slot whole.
        self.slot_of[key] = slot

    def drop(self, key: int) -> list[tuple[int, list[int]]]:
        """Forget ``key``'s slot (a rank announced another row for it); the (position, row) announcements
        its bits stood for, to be tabled as rows."""
        slot = self.slot_of.pop(key)
        self.drops += 1
        bit = 1 << slot
        row = self.all_rows[slot][0]
        announced = []
        for position, mask in enumerate(self.pending):
            if mask & bit:
                announced.append((position, row))
                self.pending[position] = mask & ~bit
        self.waiting_mask &= ~bit
        return announced

    def take_ready(self, now: float) -> list[int]:
        """The slots whose bit every rank has set, in slot order; their bits are cleared."""
        pending = self.pending
        ready = pending[0]
        for mask in pending[1:]:
            ready &= mask
        if ready:
            keep = ~ready
            for position in range(self.size):
                pending[position] &= keep
        waiting = 0
        for mask in pending:
            waiting |= mask
        began = waiting & ~self.waiting_mask
        if began:
            self._since.append((now, began))
        if self._since and waiting != self.waiting_mask | began:
            self._since = [(since, mask) for since, mask in self._since if mask & waiting]
        self.waiting_mask = waiting
        return bits_of(ready) if ready else []

    def _waiting_since(self) -> Iterator[tuple[float, int]]:
        """(since, slot) of every slot some rank has announced and not every rank, oldest first."""
        waiting = self.waiting_mask
        for since, mask in self._since:
            if mask & waiting:
                for slot in bits_of(mask & waiting):
                    yield since, slot

    def waiting(self) -> Iterator[tuple[int, int, str]]:
        """(slot, key, label) of every slot some rank has announced and not every rank."""
        for _, slot in self._waiting_since():
            yield slot, self.keys[slot], self.labels[slot]

    def full_row(self, slot: int) -> list[int]:
        """The slot's row with its padding, as the verdict compares rows."""
        return self.all_rows[slot][0]

    def announced_by(self, position: int, slot: int) -> bool:
        return bool(self.pending[position] >> slot & 1)

    def stalled(self, older_than_s: float) -> Iterator[tuple[int, str]]:
        """(slot, label) of slots waiting for some rank for more than ``older_than_s``."""
        now = time.monotonic()
        for since, slot in self._waiting_since():
            if now - since >= older_than_s:
                yield slot, self.labels[slot]


class Marks:
    """The response-cache slots of what was submitted since the last round, found as each is submitted.

    The submitter's thread has the operation at hand; a round that walked a thousand entries made on
    another thread would fetch each of them again. A round takes the marks only when every entry it
    announces was marked and no slot was dropped since the last round (a slot found before a drop may be
    gone); otherwise it looks at each entry itself, as it does for a round small enough to carry payloads.
    """

    def __init__(self, cache: ResponseCache) -> None:
        self.cache = cache
        self._flags = bytearray(cache.words * 64)
        self._count = 0
        self._drops = cache.drops

    def mark(self, key: int, row: list[int]) -> None:
        """Note a submission of ``key`` with ``row`` (the caller holds the engine's lock)."""
        cache = self.cache
        slot = cache.slot_of.get(key)
        # The row's own list, as the slot keeps it, is the common case: ResponseCache.slot's test, inline.
        if slot is not None and (cache.rows[slot] is row or cache.slot(key, row) is not None):
            self._flags[slot] = 49  # "1"
            self._count += 1

    def take(self, entries: int) -> int | None:
        """The bit vector of the marks if all ``entries`` submitted since the last take were marked and no
        slot has been dropped since; None otherwise. Starts afresh."""
        count, flags, drops = self._count, self._flags, self._drops
        self._drops = self.cache.drops
        if count:
            self._flags = bytearray(len(flags))
            self._count = 0
        if count != entries or not count or drops != self._drops:
            return None
        return flags_mask(flags)
