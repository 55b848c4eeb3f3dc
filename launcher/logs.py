"""Turn the ranks' raw output chunks into whole, prefixed console lines and raw per-rank files.

Everything stays bytes: invalid UTF-8 or a multibyte character split across writes passes through untouched.
Work is done per chunk with C-level bytes operations (split/replace/join), not per line, because a busy job
relays millions of lines per second.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from launcher.errors import UsageError

Stream = Literal["stdout", "stderr"]
log = logging.getLogger(__name__)

TAIL_BYTES = 8192
# A carriage return followed by more text starts a progress-bar redraw: it gets the prefix again.
_CR_REDRAW = re.compile(rb"\r(?=[^\r\n])")
_COLORS = (31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96)


def prefix_lines(block: bytes, prefix: bytes) -> bytes:
    """`block` is whole lines, each ending in b"\\n"; every line (and every \\r redraw) gets `prefix`."""
    if not prefix:
        return block
    body = block[:-1]
    if b"\r" in body:
        cr_prefix = b"\r" + prefix
        body = _CR_REDRAW.sub(lambda _: cr_prefix, body)
    return prefix + body.replace(b"\n", b"\n" + prefix) + b"\n"


class LineBuffer:
    """Holds the unfinished last line of one (rank, stream) until its newline arrives."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """Returns the complete lines now available (possibly b"")."""
        cut = data.rfind(b"\n")
        if cut < 0:
            self._partial += data
            return b""
        whole = self._partial + data[: cut + 1] if self._partial else data[: cut + 1]
        self._partial = data[cut + 1 :]
        return whole

    def flush(self) -> bytes:
        """The final line without a newline, terminated so it is not merged with anything after it."""
        rest, self._partial = self._partial, b""
        return rest + b"\n" if rest else b""


@dataclass(frozen=True)
class LogOptions:
    prefix: Literal["rank", "host", "none"] = "rank"
    timestamp: bool = False
    color: bool = False
    console_ranks: frozenset[int] | None = None
    output_dir: Path | None = None


class LogRelay:
    """Routes each rank's chunks to the console (prefixed, whole lines) and to `--output-dir` (raw)."""

    def __init__(self, out: BinaryIO, err: BinaryIO, hosts: dict[int, str], options: LogOptions) -> None:
        self._sinks = {"stdout": out, "stderr": err}
        self._options = options
        self._buffers: dict[tuple[int, str], LineBuffer] = {}
        self._prefixes = {rank: self._make_prefix(rank, host) for rank, host in hosts.items()}
        self._tails: dict[int, deque[bytes]] = {rank: deque() for rank in hosts}
        self._tail_sizes: dict[int, int] = dict.fromkeys(hosts, 0)
        self._files: dict[tuple[int, str], BinaryIO] = {}
        if options.output_dir is not None:
            try:
                for rank in hosts:
                    rank_dir = options.output_dir / f"rank.{rank}"
                    rank_dir.mkdir(parents=True, exist_ok=True)
                    for stream in ("stdout", "stderr"):
                        self._files[(rank, stream)] = open(rank_dir / stream, "wb")  # noqa: SIM115
            except OSError as exc:
                self._close_files()
                raise UsageError(f"--output-dir {options.output_dir}: {exc.strerror or exc}") from None

    def _make_prefix(self, rank: int, host: str) -> bytes:
        mode = self._options.prefix
        if mode == "none":
            return b""
        text = f"[{host}:{rank}]" if mode == "host" else f"[{rank}]"
        if self._options.color:
            text = f"\x1b[{_COLORS[rank % len(_COLORS)]}m{text}\x1b[0m"
        return (text + " ").encode()

    def set_hosts(self, hosts: dict[int, str]) -> None:
        """A new attempt may place ranks on other hosts (elastic): prefixes follow, files stay per rank."""
        self._prefixes = {rank: self._make_prefix(rank, host) for rank, host in hosts.items()}

    def feed(self, rank: int, stream: Stream, data: bytes) -> None:
        file = self._files.get((rank, stream))
        if file is not None:
            try:
                file.write(data)
            except OSError as exc:
                # A full disk must not take the job down; the console still shows everything.
                log.warning(
                    "cannot write rank %d's %s to --output-dir (%s); no longer writing it", rank, stream, exc
                )
                del self._files[(rank, stream)]
                with contextlib.suppress(OSError):
                    file.close()
        if stream == "stderr":
            self._remember(rank, data)
        key = (rank, stream)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = LineBuffer()
        whole = buf.feed(data)
        if whole:
            self._emit(rank, stream, whole)

    def _emit(self, rank: int, stream: str, whole: bytes) -> None:
        ranks = self._options.console_ranks
        if ranks is not None and rank not in ranks:
            return
        prefix = self._prefixes.get(rank, b"")
        if self._options.timestamp:
            now = time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d} "
            prefix = stamp.encode() + prefix
        self._write(stream, prefix_lines(whole, prefix))

    def _write(self, stream: str, data: bytes) -> None:
        sink = self._sinks.get(stream)
        if sink is None:
            return
        try:
            sink.write(data)
        except BrokenPipeError:
            self._console_closed(stream)

    def _console_closed(self, stream: str) -> None:
        """The reader of our stdout/stderr went away (`distrun ... | head`): the job goes on unseen.

        Stopping hours of training because a pager was closed would be worse than losing the rest of the
        view; --output-dir files still get everything.
        """
        sink = self._sinks.pop(stream)
        # Python would otherwise complain about the unflushable stream at exit.
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sink.fileno())
        log.warning("console %s closed; the job continues and its %s is no longer shown", stream, stream)

    def _remember(self, rank: int, data: bytes) -> None:
        tail = self._tails.setdefault(rank, deque())
        tail.append(data)
        size = self._tail_sizes.get(rank, 0) + len(data)
        while size - len(tail[0]) >= TAIL_BYTES:
            size -= len(tail.popleft())
        self._tail_sizes[rank] = size

    def stderr_tail(self, rank: int, lines: int = 5) -> list[str]:
        """The rank's last stderr lines, decoded leniently for the failure summary."""
        text = b"".join(self._tails.get(rank, ())).decode("utf-8", errors="replace")
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def note(self, lines: list[str]) -> None:
        """distrun's own closing words (the failure summary) on the console's stderr."""
        if lines:
            self._write("stderr", "".join(f"distrun: {line}\n" for line in lines).encode())
        self.flush()

    def flush(self) -> None:
        for stream, sink in list(self._sinks.items()):
            try:
                sink.flush()
            except BrokenPipeError:
                self._console_closed(stream)

    def finish(self) -> None:
        """End every unfinished last line (the job is over, nothing can complete them)."""
        for (rank, stream), buf in self._buffers.items():
            rest = buf.flush()
            if rest:
                self._emit(rank, stream, rest)
        self.flush()

    def close(self) -> None:
        self.finish()
        self._close_files()

    def _close_files(self) -> None:
        for file in self._files.values():
            with contextlib.suppress(OSError):  # a full disk: already said when writing failed
                file.close()
