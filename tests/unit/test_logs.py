"""The relay's pieces: line buffers, redraw collapsing, UTF-8 cuts, and LogRelay writing to real pipes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.console.relay import LINE_LIMIT, LineBuffer, LogOptions, LogRelay, collapse_redraws, utf8_cut
from launcher.errors import UsageError


def test_line_buffer_passes_whole_lines_and_keeps_the_rest() -> None:
    buf = LineBuffer()
    assert buf.feed(b"a\nb") == b"a\n"
    assert buf.feed(b"c\nd\n") == b"bc\nd\n"
    assert buf.feed(b"e") == b"" and buf.text == b"e"
    assert buf.flush() == b"e\n" and buf.flush() == b""


def test_line_buffer_keeps_only_the_latest_redraw() -> None:
    buf = LineBuffer()
    assert buf.feed(b"\r 10%") == b"" and buf.redrawn
    assert buf.feed(b"\r 20%\r 30%") == b"" and buf.text == b" 30%"
    assert buf.feed(b"|#") == b"" and not buf.redrawn and buf.text == b" 30%|#"
    assert buf.pending == bytearray(b" 30%|#")


def test_a_trailing_carriage_return_waits_to_see_whether_it_ends_a_line() -> None:
    buf = LineBuffer()
    assert buf.feed(b"hello\r") == b"" and buf.text == b"hello" and not buf.redrawn
    assert collapse_redraws(buf.feed(b"\n")) == b"hello\n"
    assert buf.feed(b"old\r") == b"" and buf.feed(b"new") == b"" and buf.redrawn and buf.text == b"new"


def test_an_endless_line_goes_out_in_pieces_without_splitting_a_character() -> None:
    buf = LineBuffer()
    data = ("é" * LINE_LIMIT).encode()  # 2 bytes each: 128 KiB
    out = buf.feed(data)
    pieces = out.split(b"\n")[:-1]
    assert len(pieces) == 1 and len(pieces[0]) == LINE_LIMIT
    assert len(buf.pending) == LINE_LIMIT
    shifted = LineBuffer()
    pieces = shifted.feed(b"x" + data).split(b"\n")[:-1]
    assert len(pieces[0]) == LINE_LIMIT - 1  # one byte short: the character across the limit stays whole
    assert all(len(piece) <= LINE_LIMIT and piece.decode() for piece in pieces)
    assert b"".join(pieces) + shifted.pending == b"x" + data


def test_feeding_in_small_pieces_stays_bounded() -> None:
    buf = LineBuffer()
    written = b"".join(buf.feed(b"x" * 1000) for _ in range(1000))
    assert len(buf.pending) <= LINE_LIMIT
    assert written.count(b"x") + len(buf.pending) == 1_000_000


def test_utf8_cut_never_leaves_half_a_character() -> None:
    data = "aé€😀".encode()  # 1 + 2 + 3 + 4 bytes
    assert [utf8_cut(data, i) for i in range(len(data) + 1)] == [0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10]
    assert utf8_cut(b"\xff\xfe\xfd", 2) == 2  # not UTF-8: cut where asked


def test_collapse_redraws_keeps_what_a_terminal_finally_shows() -> None:
    assert collapse_redraws(b"plain\n") == b"plain\n"
    assert collapse_redraws(b"10%\r50%\r100%\nnext\n") == b"100%\nnext\n"
    assert collapse_redraws(b"windows\r\nline\r\n") == b"windows\nline\n"


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_stdout_and_stderr_keep_the_order_they_arrived_in(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    relay = LogRelay(write_fd, write_fd, {0: "h"}, LogOptions())
    relay.feed(0, "stdout", b"one\n")
    relay.feed(0, "stderr", b"two\n")
    relay.feed(0, "stdout", b"three\n")
    relay.tick(0.0)
    assert _drain(read_fd) == b"[0] one\n[0] two\n[0] three\n"


def test_redraws_off_a_terminal_are_lines_at_most_one_per_interval(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    relay = LogRelay(write_fd, write_fd, {0: "h", 1: "h"}, LogOptions(progress_interval=5.0))
    relay.feed(0, "stderr", b"\r 10%")
    relay.feed(1, "stderr", b"\r 70%")
    relay.feed(0, "stderr", b"\r 20%")
    relay.feed(0, "stderr", b"\r 30%")
    relay.tick(0.0)
    assert _drain(read_fd) == b"[0]  10%\n[1]  70%\n"
    deadline = relay.next_deadline()
    assert deadline is not None
    relay.tick(deadline)
    assert _drain(read_fd) == b"[0]  30%\n"  # the newest state held back, not every one
    relay.feed(0, "stderr", b"\r100%\n")
    relay.feed(1, "stderr", b"\n")
    relay.finish()
    assert (
        _drain(read_fd) == b"[0] 100%\n"
    )  # rank 1's bar was written already: its last state is not repeated


def test_a_partial_line_waits_for_the_interval_off_a_terminal(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    relay = LogRelay(write_fd, write_fd, {0: "h"}, LogOptions(progress_interval=2.0))
    relay.feed(0, "stdout", b"Loading... ")
    relay.tick(0.0)
    assert _drain(read_fd) == b""
    deadline = relay.next_deadline()
    assert (
        deadline is not None and deadline - time.monotonic() > 1.0
    )  # 2 s from the feed, on the monotonic clock
    relay.tick(deadline)
    assert _drain(read_fd) == b"[0] Loading... \n"
    relay.feed(0, "stdout", b"done\n")
    relay.finish()
    assert _drain(read_fd) == b"[0] done\n", "the rest of the line, not the line again"
    assert relay.next_deadline() is None


def test_rank_filter_hides_lines_and_progress_but_files_get_everything(
    pipe: tuple[int, int], tmp_path: Path
) -> None:
    read_fd, write_fd = pipe
    relay = LogRelay(
        write_fd, write_fd, {0: "h", 1: "h"}, LogOptions(console_ranks=frozenset({1}), output_dir=tmp_path)
    )
    relay.feed(0, "stdout", b"hidden\n\r 5%")
    assert (tmp_path / "rank.0" / "stdout").read_bytes() == b"hidden\n\r 5%"  # on disk before any flush
    relay.feed(1, "stdout", b"shown\n")
    relay.close()
    assert _drain(read_fd) == b"[1] shown\n"


def test_stderr_tail_for_the_summary_shows_final_bar_states(pipe: tuple[int, int]) -> None:
    _, write_fd = pipe
    relay = LogRelay(write_fd, write_fd, {0: "h"}, LogOptions())
    relay.feed(0, "stderr", b"\r 10%\r 99%\nTraceback\nValueError: bad\n")
    assert relay.stderr_tail(0) == [" 99%", "Traceback", "ValueError: bad"]


def test_a_closed_console_is_left_alone(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    relay = LogRelay(write_fd, write_fd, {0: "h"}, LogOptions())
    os.close(read_fd)
    relay.feed(0, "stdout", b"nobody reads this\n")
    relay.tick(0.0)  # EPIPE: no exception, the job goes on
    relay.feed(0, "stdout", b"nor this\n")
    relay.close()


def test_unwritable_output_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="--output-dir"):
        LogRelay(1, 2, {0: "h"}, LogOptions(output_dir=blocker / "sub"))


def test_ranks_an_elastic_job_grows_to_get_their_files_and_prefixes(
    pipe: tuple[int, int], tmp_path: Path
) -> None:
    read_fd, write_fd = pipe
    relay = LogRelay(write_fd, write_fd, {0: "a"}, LogOptions(prefix="host", output_dir=tmp_path))
    relay.set_hosts({0: "b", 1: "c"})
    relay.feed(1, "stdout", b"joined\n")
    relay.feed(0, "stdout", b"moved\n")
    relay.close()
    assert (tmp_path / "rank.1" / "stdout").read_bytes() == b"joined\n"
    assert (tmp_path / "rank.0" / "stdout").read_bytes() == b"moved\n"
    assert _drain(read_fd) == b"[c:1] joined\n[b:0] moved\n"
