"""What a rank announces in its engine's round (``collectives.engine_rounds``): each operation submitted since
the last round as a row (a key and the call's facts), with the bytes of a small allreduce when they may ride;
or, once the response cache holds it, by its bit, the bytes of a burst of cached allreduces then riding
behind the bits as one block. Also how operations are keyed, and how many bytes may ride in a round.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch

from collectives.engine_cache import ResponseCache, mask_of
from collectives.engine_values import Fusion

__all__ = [
    "Announcement",
    "Announcing",
    "Block",
    "announce",
    "name_key",
    "payload_fits",
    "ride_budget",
]

# How many cached operations a round may carry with their payloads rather than as bits.
_RIDERS = 4
# How many cached operations' bytes may ride behind their bits as one block. A block saves its burst a
# collective, but the round touches every operation and its bytes, out of cache by then (some 2 us an
# operation at 4 ranks here): past a few hundred operations the collective costs less.
_BLOCK_MOST = 256
# A payload rides in the round when every rank receiving every rank's bytes costs no more than the
# allreduce it replaces: here gloo's allreduce of 64 KB takes as long as two all_gathers of every rank's
# 64 KB with 2 ranks, 1.7 with 4.
_PAYLOAD_BYTES_ALL_RANKS = 512 * 1024


@functools.lru_cache(maxsize=1 << 16)
def name_key(name: str) -> int:
    """A positive int64 naming ``name`` identically in every process; ordered operations use negative keys."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=7).digest(), "big") + 1


def payload_fits(nbytes: int, size: int) -> bool:
    """Whether a tensor of ``nbytes`` may ride in the round of a set of ``size`` ranks."""
    return nbytes * size <= _PAYLOAD_BYTES_ALL_RANKS


def ride_budget(size: int) -> int:
    """The bytes of payload one rank may put in a round of a set of ``size`` ranks."""
    return _PAYLOAD_BYTES_ALL_RANKS // size


class Announcement(NamedTuple):
    """One operation announced: its key, its row (trailing -1s may be left out), its label for the stall
    report, and optionally a payload (a contiguous CPU tensor whose bytes every rank receives)."""

    key: int
    row: list[int]
    label: str
    payload: torch.Tensor | None = None


class Announcing(Protocol):
    """An engine's entry, as a round announces it."""

    key: int
    fusion: Fusion | None
    row: list[int] | None  # the row, once made (announced_row makes it)

    def announced_row(self) -> list[int]: ...

    def announcement(self) -> Announcement: ...


class Block(NamedTuple):
    """Cached operations of one fusion whose bytes ride in the round behind their bits: their tensors and
    byte counts, in slot order (the bits' order), and the bytes in all."""

    tensors: list[torch.Tensor]
    sizes: list[int]
    nbytes: int


def announce(
    cache: ResponseCache,
    new: Sequence[Announcing],
    ride_bytes: int,
    marked: int | None = None,
    *,
    block: bool = True,
) -> tuple[list[Announcement], int, Block | None]:
    """A round's announcements of ``new``: rows for what the response cache does not hold (or what rides
    with its payload, ``ride_bytes`` at most in all), the bit vector of the cached rest, and (``block``:
    allowed) the block of their bytes when they may ride behind their bits. ``marked``: the bit vector of
    every entry of ``new``, found as they were submitted (``Marks.take``), if it is."""
    if not cache.slot_of:
        return [e.announcement() for e in new], 0, None
    # A burst's cached operations go by their bits, not as rows: a thousand rows packed, unpacked and tabled
    # cost more than a fused allreduce. Their bytes ride behind the bits when they fit, as one block.
    few = len(new) <= _RIDERS
    if marked is not None and not few:
        return [], marked, _block(cache, new, ride_bytes) if block else None
    mine: list[Announcement] = []
    riders: list[tuple[Announcing, int]] = []
    riding = 0
    slots: list[int] = []
    for e in new:
        # The row is at hand for every operation that brought its plan's row.
        slot = cache.slot(e.key, e.row or e.announced_row())
        if slot is not None:
            fusion = e.fusion
            if few and fusion is not None and fusion.reduce is not None:
                # It may ride with its payload, if the round's payloads are few enough to.
                riders.append((e, slot))
                riding += fusion.nbytes
            else:
                slots.append(slot)
            continue
        mine.append(e.announcement())
    if riders:
        # Lists, not generators: a generator is a Python call per item.
        if riding <= ride_bytes:
            mine.extend([e.announcement() for e, _ in riders])
        else:
            slots.extend([slot for _, slot in riders])
    behind = _block(cache, new, ride_bytes) if block and slots and not mine and not few else None
    return mine, mask_of(slots, cache.words), behind


def _block(cache: ResponseCache, new: Sequence[Announcing], ride_bytes: int) -> Block | None:
    """The block of ``new``'s bytes (every one cached) if they may ride: all of one fusion that reduces a
    block, ``ride_bytes`` at most in all."""
    first = new[0].fusion
    if first is None or first.reduce_block is None or len(new) > _BLOCK_MOST:
        return None
    fusion_key = first.key
    slot_of = cache.slot_of
    riders: list[tuple[int, torch.Tensor, int]] = []
    total = 0
    for e in new:
        fusion = e.fusion
        if fusion is None or fusion.key != fusion_key:
            return None
        total += fusion.nbytes
        riders.append((slot_of[e.key], fusion.tensor, fusion.nbytes))
    if total > ride_bytes:
        return None
    riders.sort(key=_slot)
    return Block([tensor for _, tensor, _ in riders], [nbytes for _, _, nbytes in riders], total)


_slot = operator.itemgetter(0)
