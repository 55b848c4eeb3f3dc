"""Each rank's unfinished line (a progress bar's latest redraw) on the console.

On a terminal the ranks' current lines live in a status area at the bottom, redrawn in place, while complete
lines scroll above it (as pip, cargo or docker compose draw progress). Anywhere else a redraw becomes an
ordinary prefixed line, at most one per rank and stream per interval; the complete line that ends a bar is
always written, so the last state is never lost.
"""

from __future__ import annotations

import heapq
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Protocol

from launcher.console.writer import Console

Key = tuple[int, str]  # (rank, stream)

# A terminal is redrawn at most this often: enough to look live, cheap for a million redraws.
FRAME_SECONDS = 0.05
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|[\x00-\x08\x0a-\x1f\x7f]")


def visible_text(text: str) -> str:
    """`text` without escape sequences and control characters: what a terminal shows of it."""
    return _ANSI.sub("", text)


_PERCENT = re.compile(r"(\d{1,3}(?:\.\d+)?)%")
_ERASE_LINE = b"\x1b[K"


class RedrawDisplay(Protocol):
    """Where the relay puts unfinished lines. `show` may be called for every chunk: it must be cheap."""

    def show(self, key: Key, label: bytes, text: bytes, now: float) -> None: ...

    def done(self, key: Key) -> bytes | None:
        """The line was completed: drop its status. Returns the text already written out as a line, if any
        (the relay then does not write that line twice)."""

    def before_lines(self) -> None:
        """Lines are about to be written to the console."""

    def tick(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...


class RedrawLines:
    """Redraws as ordinary lines on a pipe or file, at most one per key per `interval` seconds."""

    def __init__(self, console: Console, interval: float) -> None:
        self._console = console
        self._interval = interval
        self._last: dict[Key, float] = {}
        self._written: dict[Key, bytes] = {}
        self._held: dict[Key, tuple[bytes, bytes]] = {}  # the newest (label, text) not yet written, by key
        self._due: list[tuple[float, Key]] = []

    def show(self, key: Key, label: bytes, text: bytes, now: float) -> None:
        last = self._last.get(key)
        if last is None or now - last >= self._interval:
            self._held.pop(key, None)
            self._write(key, label, text, now)
            return
        if key not in self._held:
            heapq.heappush(self._due, (last + self._interval, key))
        self._held[key] = (label, text)

    def _write(self, key: Key, label: bytes, text: bytes, now: float) -> None:
        self._last[key] = now
        self._written[key] = text
        self._console.write(key[1], label + text + b"\n")

    def done(self, key: Key) -> bytes | None:
        # The complete line supersedes any redraw held back; the next bar starts its interval afresh.
        self._held.pop(key, None)
        self._last.pop(key, None)
        return self._written.pop(key, None)

    def before_lines(self) -> None:
        pass

    def tick(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, key = heapq.heappop(self._due)
            held = self._held.pop(key, None)
            if held is not None:
                self._write(key, *held, now)

    def next_deadline(self) -> float | None:
        # Entries whose text was superseded by a complete line stay in the heap and fire as no-ops.
        return self._due[0][0] if self._due else None


@dataclass
class _Status:
    """One line of the status area, as last drawn."""

    label: bytes
    label_width: int
    text: bytes
    seq: int
    group: str


class StatusArea:
    """The status area at the bottom of a terminal: one line per rank (or per host), redrawn in place.

    The cursor always sits at the start of the line below the area, so erasing it is "up N lines, erase
    below". Lines are cut to the terminal's width so none wraps and N stays right.
    """

    def __init__(self, console: Console, fd: int, *, group_by_host: bool, hosts: dict[int, str]) -> None:
        self._console = console
        self._fd = fd
        self._group_by_host = group_by_host
        self._hosts = hosts
        self._statuses: dict[Key, _Status] = {}
        self._drawn = 0  # lines of the area now on screen
        self._dirty = False
        self._next_frame = 0.0
        self._seq = 0
        self._footer: list[bytes] = []  # a line per host from the live samples, below the ranks' lines

    def show(self, key: Key, label: bytes, text: bytes, now: float) -> None:
        self._seq += 1
        status = self._statuses.get(key)
        if status is None:
            width = display_width(_ANSI.sub("", label.decode("utf-8", "replace")))
            group = self._hosts.get(key[0], "") if self._group_by_host else str(key)
            self._statuses[key] = _Status(label, width, text, self._seq, group)
        else:
            status.label = label  # with --timestamp it changes
            status.text = text
            status.seq = self._seq
        self._dirty = True

    def set_footer(self, lines: list[bytes]) -> None:
        """The lines below the ranks' (a compact line per host), redrawn with the area."""
        if lines != self._footer:
            self._footer = lines
            self._dirty = True

    def done(self, key: Key) -> bytes | None:
        if self._statuses.pop(key, None) is not None:
            self._dirty = True
        return None

    def before_lines(self) -> None:
        if self._drawn:
            self._console.write("stdout", b"\r\x1b[%dA\x1b[J" % self._drawn)
            self._drawn = 0
            self._dirty = True

    def tick(self, now: float) -> None:
        # An erased area comes back at once (it would flicker otherwise); a changed one at most per frame.
        shown = self._statuses or self._footer
        if self._dirty and (now >= self._next_frame or (not self._drawn and shown)):
            self._render()
            self._next_frame = now + FRAME_SECONDS

    def next_deadline(self) -> float | None:
        return self._next_frame if self._dirty else None

    def _render(self) -> None:
        self._dirty = False
        try:
            cols, rows = os.get_terminal_size(self._fd)
        except OSError:
            cols, rows = 80, 24
        footer = self._footer[: max(0, rows - 3)]
        lines = [self._fit(s, cols - 1) for s in self._visible(max(1, rows - 2 - len(footer)))]
        lines += [truncate(line.decode("utf-8", "replace"), cols - 1).encode() for line in footer]
        erase = b"\r\x1b[%dA\x1b[J" % self._drawn if self._drawn else b""
        self._console.write("stdout", erase + b"".join(line + _ERASE_LINE + b"\n" for line in lines))
        self._drawn = len(lines)

    def _visible(self, room: int) -> list[_Status]:
        statuses = [status for _, status in sorted(self._statuses.items())]  # by rank, then stream
        if self._group_by_host:
            newest: dict[str, _Status] = {}
            for s in statuses:
                if s.group not in newest or s.seq > newest[s.group].seq:
                    newest[s.group] = s
            statuses = list(newest.values())
        if len(statuses) <= room:
            return statuses
        # Above a screenful: the slowest and the fastest bar, and how many there are.
        ranked = sorted(statuses, key=_progress_of)
        slowest, fastest = ranked[0], ranked[-1]
        note = f"distrun: {len(statuses)} bars; the slowest and the fastest shown".encode()
        summary = _Status(b"", 0, note, 0, "")
        return [slowest, fastest, summary][: max(1, room)]

    @staticmethod
    def _fit(status: _Status, cols: int) -> bytes:
        room = max(0, cols - status.label_width)
        text = _ANSI.sub("", status.text.decode("utf-8", "replace").replace("\t", " "))
        return status.label + truncate(text, room).encode()


def _progress_of(status: _Status) -> tuple[float, int]:
    found = _PERCENT.search(status.text.decode("utf-8", "replace"))
    return (float(found.group(1)) if found else 0.0, status.seq)


def display_width(text: str) -> int:
    if text.isascii():
        return len(text)
    return sum(_char_width(c) for c in text)


def truncate(text: str, cols: int) -> str:
    """The longest start of `text` that fits in `cols` terminal columns."""
    if text.isascii():
        return text[:cols]
    used = 0
    for i, char in enumerate(text):
        used += _char_width(char)
        if used > cols:
            return text[:i]
    return text


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
