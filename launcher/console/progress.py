"""How far a fan-out got, and one line on a terminal that shows it: "connecting 96/128 hosts, 1 failed".

The line is drawn only when the stream is a TTY (a pipe or a file gets nothing at all) as `\\r`, the text and
erase-to-end-of-line, never longer than the terminal is wide, so it never wraps. It is erased before any log
record is written and when the phase ends, so whatever is printed next starts on a clean line and no other
writer needs to know about it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from launcher.core.progress import Progress

ERASE_LINE = "\r\x1b[K"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


class ProgressLine:
    """Draws `Progress` on `stream` when it is a terminal; thread-safe, a no-op otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream if _is_tty(stream) else None
        self._lock = threading.Lock()
        self._shown = False

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def __call__(self, progress: Progress) -> None:
        self.show(str(progress))

    def show(self, text: str) -> None:
        if self._stream is None:
            return
        with self._lock:
            self._write(ERASE_LINE + text[: self._width() - 1])
            self._shown = True

    def clear(self) -> None:
        if self._stream is None:
            return
        with self._lock:
            if self._shown:
                self._write(ERASE_LINE)
                self._shown = False

    def _width(self) -> int:
        assert self._stream is not None
        try:
            return os.get_terminal_size(self._stream.fileno()).columns or 80
        except (OSError, ValueError):
            return 80

    def _write(self, text: str) -> None:
        assert self._stream is not None
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            self._stream = None  # the terminal went away: nothing more to draw


class _ClearFirst(logging.Filter):
    def __init__(self, line: ProgressLine) -> None:
        super().__init__()
        self.line = line

    def filter(self, record: logging.LogRecord) -> bool:
        self.line.clear()
        return True


@contextmanager
def progress_line(stream: TextIO) -> Iterator[ProgressLine]:
    """A ProgressLine for the span of one phase: log records erase it first, and it is gone at the end."""
    line = ProgressLine(stream)
    if not line.enabled:
        yield line
        return
    handlers = list(logging.getLogger().handlers)
    guard = _ClearFirst(line)
    for handler in handlers:
        handler.addFilter(guard)
    try:
        yield line
    finally:
        for handler in handlers:
            handler.removeFilter(guard)
        line.clear()
