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

import os
import time
from collections.abc import Iterator

__all__ = ["ResponseCache", "bits_of", "capacity_from_env", "mask_of"]

DEFAULT_CAPACITY = 1024


def capacity_from_env() -> int:
    raw = os.environ.get("HOROVOD_CACHE_CAPACITY", "").strip()
    return max(0, int(raw)) if raw else DEFAULT_CAPACITY


def bits_of(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    # Through its binary digits: a shift or a mask of a 1024-bit int allocates one, per bit.
    digits = bin(mask)[:1:-1]
    if mask.bit_count() > 64:
        return [at for at, digit in enumerate(digits) if digit == "1"]
    out: list[int] = []
    at = digits.find("1")
    while at >= 0:
        out.append(at)
        at = digits.find("1", at + 1)
    return out


def mask_of(slots: list[int], words: int) -> int:
    """The bit vector of ``slots``."""
    flags = bytearray(words * 64)
    for slot in slots:
        flags[slot] = 49  # "1"
    if not slots:
        return 0
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
        self.first_seen: dict[int, float] = {}

    def slot(self, key: int, row: list[int]) -> int | None:
        """The slot of ``key`` if it is cached with exactly ``row``."""
        slot = self.slot_of.get(key)
        if slot is None or self.rows[slot] != row:
            return None
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
        self.slot_of[key] = len(self.keys)
        self.keys.append(key)
        self.rows.append(announced)
        self.labels.append(label)
        self.all_rows.append([first] * self.size)

    def drop(self, key: int) -> list[tuple[int, list[int]]]:
        """Forget ``key``'s slot (a rank announced another row for it); the (position, row) announcements
        its bits stood for, to be tabled as rows."""
        slot = self.slot_of.pop(key)
        bit = 1 << slot
        row = self.all_rows[slot][0]
        announced = []
        for position, mask in enumerate(self.pending):
            if mask & bit:
                announced.append((position, row))
                self.pending[position] = mask & ~bit
        self.first_seen.pop(slot, None)
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
        slots = bits_of(ready) if ready else []
        first_seen = self.first_seen
        if first_seen:
            for slot in slots:
                first_seen.pop(slot, None)
        waiting = 0
        for mask in pending:
            waiting |= mask
        if waiting:
            for slot in bits_of(waiting):
                if slot not in first_seen:
                    first_seen[slot] = now
        return slots

    def waiting(self) -> Iterator[tuple[int, int, str]]:
        """(slot, key, label) of every slot some rank has announced and not every rank."""
        for slot in self.first_seen:
            yield slot, self.keys[slot], self.labels[slot]

    def full_row(self, slot: int) -> list[int]:
        """The slot's row with its padding, as the verdict compares rows."""
        return self.all_rows[slot][0]

    def announced_by(self, position: int, slot: int) -> bool:
        return bool(self.pending[position] >> slot & 1)

    def stalled(self, older_than_s: float) -> Iterator[tuple[int, str]]:
        """(slot, label) of slots waiting for some rank for more than ``older_than_s``."""
        now = time.monotonic()
        for slot, since in self.first_seen.items():
            if now - since >= older_than_s:
                yield slot, self.labels[slot]
