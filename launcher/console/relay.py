"""Turn the ranks' raw output chunks into prefixed console lines, live progress and raw per-rank files.

Everything stays bytes: invalid UTF-8 passes through untouched, and a multibyte character is never cut in two.
Work is done per chunk with C-level bytes operations (split/replace/join), not per line, because a busy job
relays millions of lines per second; what a rank has not ended with a newline is held in a buffer of at most
LINE_LIMIT bytes per (rank, stream), so no output shape can make the relay slow or large.

Time-driven work (a partial line shown after a quiet spell, a held-back redraw, a terminal frame) happens in
`LogRelay.tick(now)`; the supervisor's loop must wake by `LogRelay.next_deadline()` and then call `tick`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from launcher.agent.protocol import write_all
from launcher.console.redraws import RedrawDisplay, RedrawLines, StatusArea, visible_text
from launcher.console.writer import Console, same_terminal, use_color
from launcher.core.plan import plural
from launcher.core.scrub import SCRUBBER
from launcher.errors import UsageError

if TYPE_CHECKING:
    from launcher.core.config import LaunchConfig

Stream = Literal["stdout", "stderr"]
log = logging.getLogger(__name__)

TAIL_BYTES = 8192
# An unfinished line longer than this is written out in pieces, each prefixed.
LINE_LIMIT = 64 * 1024
# On a terminal, a partial line with no redraw is shown once its rank has been quiet this long (it may be a
# prompt, or `print(..., end="")` before a long step).
QUIET_SECONDS = 0.05
# A console write that blocks longer than this counts as time the relay was not reading (see `stalled`).
STALL_SECONDS = 0.01
_COLORS = (31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96)


def prefix_lines(block: bytes, prefix: bytes) -> tuple[bytes | memoryview, ...]:
    """`block` is whole lines, each ending in b"\\n": the pieces that write each line with `prefix` in front.

    Pieces, not one joined value: the console gathers them in one write, so the block is copied only once.
    """
    if not prefix:
        return (block,)
    body = block.replace(b"\n", b"\n" + prefix)
    return prefix, memoryview(body)[: len(body) - len(prefix)]


def collapse_redraws(block: bytes) -> bytes:
    """Whole lines in; each reduced to what a terminal finally shows of it: the text after its last \\r."""
    if b"\r" not in block:
        return block
    block = block.replace(b"\r\n", b"\n")
    if b"\r" not in block:
        return block
    lines = block.split(b"\n")
    return b"\n".join(line[line.rfind(b"\r") + 1 :] if b"\r" in line else line for line in lines)


def utf8_cut(data: bytes | bytearray, end: int) -> int:
    """The largest cut point <= `end` that leaves no UTF-8 character unfinished before it.

    Bytes that are not UTF-8 at all are cut where asked: they have no characters to split.
    """
    end = min(end, len(data))
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:  # a continuation byte: its character starts further back
            continue
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return end - back if need > back else end
    return end


class LineBuffer:
    """The unfinished line of one (rank, stream), reduced to its latest redraw and capped at LINE_LIMIT."""

    __slots__ = ("pending", "redrawn", "shown")

    def __init__(self) -> None:
        self.pending = bytearray()  # the unfinished line since its last redraw; read-only outside
        self.redrawn = False  # the last feed carried a \r redraw: show the new state at once
        self.shown = False  # the progress display currently holds this line's text

    def feed(self, data: bytes) -> bytes:
        """Returns the whole lines now ready (possibly b""), pieces of an over-long line included."""
        self.redrawn = False
        cut = data.rfind(b"\n")
        if cut < 0:
            return self._absorb(data)
        if self.pending:
            whole = bytes(self.pending) + data[: cut + 1]
            self.pending.clear()
        else:
            whole = data if cut + 1 == len(data) else data[: cut + 1]
        if cut + 1 < len(data):
            return whole + self._absorb(data[cut + 1 :])
        return whole

    def _absorb(self, part: bytes) -> bytes:
        pending = self.pending
        start = len(pending)
        pending += part
        # A \r that is the last byte so far may yet be half of \r\n: it is judged when the next byte comes.
        cr = pending.rfind(b"\r", max(0, start - 1), len(pending) - 1)
        if cr >= 0:
            del pending[: cr + 1]
            self.redrawn = True
        if len(pending) <= LINE_LIMIT:
            return b""
        pieces = []
        while len(pending) > LINE_LIMIT:
            end = utf8_cut(pending, LINE_LIMIT)
            pieces.append(bytes(pending[:end]))
            del pending[:end]
        return b"\n".join(pieces) + b"\n"

    def take(self) -> bytes:
        """The unfinished line as it stands, ended with a newline and gone from the buffer; what follows it
        starts a line of its own. A last \r (maybe half of \r\n) and a cut character stay for later."""
        text = self.text
        del self.pending[: len(text)]
        return text + b"\n" if text else b""

    @property
    def text(self) -> bytes:
        """The line as it stands, ending on a whole character: what a progress display shows."""
        pending = self.pending
        end = len(pending) - 1 if pending.endswith(b"\r") else len(pending)
        return bytes(pending[: utf8_cut(pending, end)])

    def flush(self) -> bytes:
        """The final line without a newline, terminated so it is not merged with anything after it."""
        rest = bytes(self.pending)
        self.pending.clear()
        return rest + b"\n" if rest else b""


def _other_ranks(output_dir: Path, ranks: Iterable[int]) -> list[int]:
    """The `rank.N` directories in `output_dir` of ranks not in `ranks`, in order."""
    mine = set(ranks)
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(output_dir):
            number = entry.name.removeprefix("rank.")
            stale = entry.name.startswith("rank.") and number.isdigit() and int(number) not in mine
            if stale and entry.is_dir():
                found.append(int(number))
    return sorted(found)


_STACKS_FILE = re.compile(r"stacks-(\d+)-[\w-]+\.txt")


def earlier_stacks(output_dir: Path) -> list[str]:
    """The `stacks-N-REASON.txt` files an earlier run left in `output_dir`, by number."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(output_dir):
            match = _STACKS_FILE.fullmatch(entry.name)
            if match:
                found.append((int(match[1]), entry.name))
    return [name for _, name in sorted(found)]


def first_stacks_number(output_dir: Path | None) -> int:
    """The number of this job's first stacks file: after an earlier run's, which it then never replaces."""
    if output_dir is None:
        return 1
    numbers = [int(m[1]) for m in map(_STACKS_FILE.fullmatch, earlier_stacks(output_dir)) if m]
    return max(numbers, default=0) + 1


def _listed(names: list[str], most: int = 4) -> str:
    shown = names if len(names) <= most else [*names[: most - 1], f"... ({len(names)} files)"]
    return ", ".join(shown)


@dataclass(frozen=True)
class LogOptions:
    """How the relay labels and keeps the ranks' output (the console's options of a launch)."""

    prefix: Literal["rank", "host", "none"] = "rank"
    timestamp: bool = False
    color: bool = False
    console_ranks: frozenset[int] | None = None
    output_dir: Path | None = None
    progress_interval: float = 5.0

    @classmethod
    def of(cls, config: LaunchConfig) -> LogOptions:
        return cls(
            prefix=config.prefix,
            timestamp=config.timestamp,
            color=use_color(config.color),
            console_ranks=config.console_ranks,
            output_dir=config.output_dir,
            progress_interval=config.progress_interval,
        )


class LogRelay:
    """Routes each rank's chunks to the console (prefixed lines, live progress) and `--output-dir` (raw)."""

    def __init__(self, out_fd: int, err_fd: int, hosts: dict[int, str], options: LogOptions) -> None:
        self._options = options
        self._hosts = dict(hosts)  # shared with a terminal's progress display, which groups by host
        self._buffers: dict[tuple[int, str], LineBuffer] = {}
        self._prefixes = {rank: self._make_prefix(rank, host) for rank, host in hosts.items()}
        self._tails: dict[int, deque[bytes]] = {rank: deque() for rank in hosts}
        self._tail_sizes: dict[int, int] = dict.fromkeys(hosts, 0)
        # Partial lines waiting for their quiet spell, oldest first (all wait alike, so also by deadline).
        self._quiet: dict[tuple[int, str], float] = {}
        self._files: dict[tuple[int, str], int] = {}
        try:
            self._open_files(hosts)
        except OSError as exc:
            self._close_files()
            raise UsageError(f"--output-dir {options.output_dir}: {exc.strerror or exc}") from None
        if options.output_dir is not None:
            stale = _other_ranks(options.output_dir, hosts)
            if stale:
                # Left, not deleted: they are an earlier run's logs, which the user may still want.
                log.warning(
                    "--output-dir %s: %s from an earlier run (this job has %s); left as they are",
                    options.output_dir,
                    ", ".join(f"rank.{r}" for r in stale),
                    plural(len(hosts), "rank", "ranks"),
                )
            stacks = earlier_stacks(options.output_dir)
            if stacks:
                log.warning(
                    "--output-dir %s: %s from an earlier run; left as they are (this job's stacks begin "
                    "at stacks-%d)",
                    options.output_dir,
                    _listed(stacks),
                    first_stacks_number(options.output_dir),
                )
        terminal = same_terminal(out_fd, err_fd) and os.environ.get("TERM") != "dumb"
        self._terminal = terminal
        # Off a terminal a partial line, once written, stays: show it only if it stays unfinished a while.
        self._quiet_seconds = QUIET_SECONDS if terminal else max(QUIET_SECONDS, options.progress_interval)
        self._console = Console(out_fd, err_fd, merged=terminal)
        self._display: RedrawDisplay = (
            StatusArea(self._console, out_fd, group_by_host=options.prefix == "host", hosts=self._hosts)
            if terminal
            else RedrawLines(self._console, options.progress_interval)
        )

    @property
    def terminal(self) -> bool:
        """Whether the console is a terminal with a status area."""
        return self._terminal

    def show_hosts(self, lines: list[str]) -> None:
        """The status area's line per host (the live samples); nothing off a terminal."""
        if isinstance(self._display, StatusArea):
            self._display.set_footer([line.encode() for line in lines])

    def _make_prefix(self, rank: int, host: str) -> bytes:
        mode = self._options.prefix
        if mode == "none":
            return b""
        text = f"[{host}:{rank}]" if mode == "host" else f"[{rank}]"
        if self._options.color:
            text = f"\x1b[{_COLORS[rank % len(_COLORS)]}m{text}\x1b[0m"
        return (text + " ").encode()

    def _open_files(self, ranks: Iterable[int]) -> None:
        """`--output-dir`'s files for ranks that have none yet (OSError when one cannot be made)."""
        if self._options.output_dir is None:
            return
        for rank in ranks:
            rank_dir = self._options.output_dir / f"rank.{rank}"
            for stream in ("stdout", "stderr"):
                if (rank, stream) not in self._files:
                    rank_dir.mkdir(parents=True, exist_ok=True)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                    self._files[(rank, stream)] = os.open(rank_dir / stream, flags, 0o666)

    def set_hosts(self, hosts: dict[int, str]) -> None:
        """A new attempt may place ranks on other hosts (elastic): prefixes follow, files stay per rank, and a
        rank the job grew to gets its files now."""
        self._prefixes = {rank: self._make_prefix(rank, host) for rank, host in hosts.items()}
        self._hosts.clear()
        self._hosts.update(hosts)
        try:
            self._open_files(hosts)
        except OSError as exc:
            # Mid-job, a file that cannot be made must not end the job: the console still shows everything.
            log.warning("cannot write new ranks' output to --output-dir (%s)", exc.strerror or exc)

    def _prefix(self, rank: int) -> bytes:
        prefix = self._prefixes.get(rank, b"")
        if self._options.timestamp:
            now = time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d} "
            prefix = stamp.encode() + prefix
        return prefix

    # -- input

    def feed(self, rank: int, stream: Stream, data: bytes) -> None:
        key = (rank, stream)
        fd = self._files.get(key)
        if fd is not None:
            self._write_file(key, fd, data)
        if stream == "stderr":
            self._remember(rank, data)
        ranks = self._options.console_ranks
        if ranks is not None and rank not in ranks:
            return
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = LineBuffer()
        whole = buf.feed(data)
        if whole:
            self._lines(key, buf, whole)
        if buf.pending:
            self._quiet.pop(key, None)
            if buf.redrawn:
                self._show(key, buf, time.monotonic())
            else:
                # Re-inserted at the end: the dict stays ordered by deadline.
                self._quiet[key] = time.monotonic() + self._quiet_seconds

    def _write_file(self, key: tuple[int, str], fd: int, data: bytes) -> None:
        # Straight to the file: `tail -f` is live, and a SIGKILLed distrun loses nothing it had received.
        try:
            write_all(fd, data)
        except OSError as exc:
            # A full disk must not take the job down; the console still shows everything.
            log.warning("cannot write rank %d's %s to --output-dir (%s); no longer writing it", *key, exc)
            del self._files[key]
            with contextlib.suppress(OSError):
                os.close(fd)

    def _lines(self, key: tuple[int, str], buf: LineBuffer, whole: bytes) -> None:
        block = collapse_redraws(whole)
        if buf.shown:
            buf.shown = False
            written = self._display.done(key)
            # The line's last state already went out as a line of its own: once is enough.
            if written is not None and block.startswith(written + b"\n"):
                block = block[len(written) + 1 :]
                if not block:
                    return
        self._display.before_lines()
        self._console.write(key[1], *prefix_lines(block, self._prefix(key[0])))

    def _show(self, key: tuple[int, str], buf: LineBuffer, now: float) -> None:
        text = buf.text
        if text or buf.shown:  # a redraw to nothing clears what was shown
            buf.shown = True
            self._display.show(key, self._prefix(key[0]), text, now)

    # -- time

    def next_deadline(self) -> float | None:
        """When `tick` next has work (time.monotonic() scale); None: only new output can give it any."""
        quiet = next(iter(self._quiet.values()), None)
        shown = self._display.next_deadline()
        if quiet is None or shown is None:
            return shown if quiet is None else quiet
        return min(quiet, shown)

    def tick(self, now: float) -> None:
        """Do what is due by `now` and write the console out. Call after every batch of `feed`s, too."""
        quiet = self._quiet
        while quiet:
            key, due = next(iter(quiet.items()))
            if due > now:
                break
            del quiet[key]
            buf = self._buffers[key]
            if not buf.pending:
                continue
            if self._terminal:
                self._show(key, buf, now)  # in the status area, which the whole line replaces later
            else:
                # Off a terminal what is written stays: the line so far goes out as a line, and the rest
                # of it follows on a line of its own, so that no byte is ever written twice.
                taken = buf.take()
                if taken:
                    self._lines(key, buf, taken)
        self._display.tick(now)
        began = time.monotonic()
        self._console.flush()
        blocked = time.monotonic() - began
        if blocked > STALL_SECONDS:
            self.stalled(blocked)

    def stalled(self, seconds: float) -> None:
        """The relay could not read for `seconds` (a console that did not take its output, distrun itself
        stopped): quiet spells exclude that time, since the ranks' output may be waiting unread."""
        for key in self._quiet:
            self._quiet[key] += seconds

    def flush(self) -> None:
        self.tick(time.monotonic())

    # -- the end

    def _remember(self, rank: int, data: bytes) -> None:
        tail = self._tails.setdefault(rank, deque())
        tail.append(data[-TAIL_BYTES:])
        size = self._tail_sizes.get(rank, 0) + len(tail[-1])
        while size - len(tail[0]) >= TAIL_BYTES:
            size -= len(tail.popleft())
        self._tail_sizes[rank] = size

    def stderr_tail(self, rank: int, lines: int = 5) -> list[str]:
        """The rank's last stderr lines, decoded leniently for the failure summary."""
        text = collapse_redraws(b"".join(self._tails.get(rank, ())) + b"\n").decode("utf-8", errors="replace")
        # A line of escape sequences only (a colour reset, a progress bar's clear) shows nothing: not a line.
        return [line for line in text.splitlines() if visible_text(line).strip()][-lines:]

    def note(self, lines: list[str]) -> None:
        """distrun's own words (stopping, the failure summary) on the console's stderr, below the job's."""
        if lines:
            self._display.before_lines()
            said = "".join(f"distrun: {line}\n" for line in lines)
            self._console.write("stderr", SCRUBBER(said).encode())
        self.flush()

    def block(self, lines: list[str]) -> None:
        """distrun's own lines that read as one block (every rank's stacks): on stderr, not prefixed."""
        if lines:
            self._display.before_lines()
            self._console.write("stderr", SCRUBBER("".join(f"{line}\n" for line in lines)).encode())
        self.flush()

    def finish(self) -> None:
        """End every unfinished line (the job is over, nothing completes it): it stays as its last state."""
        self._quiet.clear()
        for key, buf in self._buffers.items():
            rest = buf.flush()
            if rest:
                self._lines(key, buf, rest)
        self.flush()

    def close(self) -> None:
        self.finish()
        self._close_files()

    def _close_files(self) -> None:
        for fd in self._files.values():
            with contextlib.suppress(OSError):  # a full disk: already said when writing failed
                os.close(fd)
        self._files.clear()
