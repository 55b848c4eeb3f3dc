"""Every byte a rank writes reaches the console exactly once, whatever the chunking and however slowly the
console reads (issue 19, defect 3).

A property test as a seeded random loop (no extra dependency; a failure names its seed): random ranks write
random lines (empty, short, multibyte, invalid UTF-8, longer than LINE_LIMIT), cut into random chunks fed in a
random interleaving, while reader threads drain the console pipes slowly with random pauses, and the relay's
clock randomly jumps past quiet spells. Redraws (`\\r`) are left out: they replace text on purpose.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator

import pytest

from launcher.console.relay import LINE_LIMIT, LogOptions, LogRelay

SEEDS = range(40)
ALPHABET = [b"a", b"b", b" ", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xff", b"\t"]


def _line(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return b""
    size = rng.randint(LINE_LIMIT - 5, LINE_LIMIT * 2) if roll > 0.97 else rng.randint(1, 300)
    if roll > 0.97:  # long lines: mostly one byte repeated, so the test stays fast
        return rng.choice(ALPHABET) * (size // 2)
    return b"".join(rng.choice(ALPHABET) for _ in range(size // 3 + 1))


def _output(rng: random.Random) -> bytes:
    text = b"\n".join(_line(rng) for _ in range(rng.randint(0, 400)))
    return text + (b"\n" if rng.random() < 0.7 else b"")  # sometimes a last line without newline


def _chunks(rng: random.Random, data: bytes) -> Iterator[bytes]:
    i = 0
    while i < len(data):
        size = rng.choice([1, 2, 3, 7, 16, 100, 4096, 65536, rng.randint(1, 200_000)])
        yield data[i : i + size]
        i += size


class SlowReader(threading.Thread):
    def __init__(self, fd: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.rng, self.data = fd, random.Random(seed), bytearray()

    def run(self) -> None:
        while chunk := os.read(self.fd, self.rng.choice([1, 100, 4096, 65536])):
            self.data += chunk
            if self.rng.random() < 0.02:
                time.sleep(self.rng.choice([0.001, 0.02]))


def _by_rank(console: bytes, ranks: int) -> dict[int, list[bytes]]:
    lines: dict[int, list[bytes]] = {r: [] for r in range(ranks)}
    assert console == b"" or console.endswith(b"\n")
    for line in console.split(b"\n")[:-1]:
        prefix, _, rest = line.partition(b"] ")
        lines[int(prefix.removeprefix(b"["))].append(rest)
    return lines


def assert_refines(written: bytes, shown: list[bytes], where: str) -> None:
    """Each line written is one or more consecutive console lines, in order: nothing lost, repeated or
    merged. Lines may be cut (over LINE_LIMIT, or shown unfinished after a quiet spell), never glued."""
    lines = written.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    pos = 0
    for number, line in enumerate(lines):
        assert pos < len(shown), f"{where}: line {number} never shown"
        joined = shown[pos]
        pos += 1
        while len(joined) < len(line) and pos < len(shown) and line.startswith(joined):
            joined += shown[pos]
            pos += 1
        assert joined == line, f"{where}: line {number} shown as {joined[:80]!r}..., written {line[:80]!r}..."
    assert pos == len(shown), f"{where}: {len(shown) - pos} console lines that no rank wrote"


@pytest.mark.parametrize("seed", SEEDS)
def test_every_byte_once_under_slow_consumers_and_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    ranks = rng.randint(1, 3)
    written = {(r, s): _output(rng) for r in range(ranks) for s in ("stdout", "stderr")}
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    readers = [SlowReader(out_r, seed), SlowReader(err_r, seed + 1000)]
    for reader in readers:
        reader.start()
    relay = LogRelay(out_w, err_w, dict.fromkeys(range(ranks), "h"), LogOptions(progress_interval=0))
    pending = {key: list(_chunks(rng, data)) for key, data in written.items()}
    while pending:
        key = rng.choice(sorted(pending))
        relay.feed(key[0], key[1], pending[key].pop(0))  # type: ignore[arg-type]
        if not pending[key]:
            del pending[key]
        if rng.random() < 0.3:
            # Sometimes the clock has passed every quiet spell: unfinished lines go out as they stand.
            relay.tick(time.monotonic() + rng.choice([0.0, 0.0, 10.0]))
    relay.close()
    os.close(out_w)
    os.close(err_w)
    for reader in readers:
        reader.join(timeout=60)
    os.close(out_r)
    os.close(err_r)
    for stream, reader in zip(("stdout", "stderr"), readers, strict=True):
        shown = _by_rank(bytes(reader.data), ranks)
        for rank in range(ranks):
            assert_refines(written[(rank, stream)], shown[rank], f"seed {seed} rank {rank} {stream}")


def test_a_console_that_blocks_does_not_cut_lines() -> None:
    """The relay's own wait on a full console is no quiet spell of the rank (`distrun | (sleep; cat)`):
    the fragment read before the wait and the rest read after it make one line, written once."""
    read_fd, write_fd = os.pipe()
    relay = LogRelay(write_fd, write_fd, {0: "h", 1: "h"}, LogOptions(progress_interval=0.2))
    filler = b"x" * 79 + b"\n"
    relay.feed(0, "stdout", filler * 2000 + b"fragment-")  # more than the pipe holds, then half a line
    reader = SlowReader(read_fd, 0)
    timer = threading.Timer(0.6, reader.start)  # nobody reads for three quiet spells
    timer.start()
    relay.tick(time.monotonic())  # blocks until the reader starts
    relay.feed(1, "stdout", b"other rank\n")  # the next turn of the loop reads only the other rank
    relay.tick(time.monotonic())
    relay.feed(0, "stdout", b"rest\n")
    relay.close()
    os.close(write_fd)
    reader.join(timeout=30)
    os.close(read_fd)
    lines = bytes(reader.data).split(b"\n")
    assert b"[0] fragment-rest" in lines
    assert not [line for line in lines if line.endswith(b"fragment-")], "the fragment was not shown alone"
    assert len(reader.data) == 2000 * 84 + len(b"[1] other rank\n[0] fragment-rest\n")
