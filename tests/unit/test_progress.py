"""The fan-out progress line on a real pseudo-terminal (rendered by pyte), and its silence on a pipe."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from launcher.backends.fanout import ALL_OR_NOTHING, fan_out
from launcher.backends.window import Window
from launcher.console.progress import progress_line
from launcher.core.progress import Progress
from launcher.errors import HostError
from tests.support import Terminal

COLUMNS = 60


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal(COLUMNS, 10)
    yield term
    term.close()


@pytest.fixture
def log_to(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Route the root logger to a stream for one test, as the CLI's basicConfig does with stderr."""
    root = logging.getLogger()
    added: list[logging.Handler] = []

    def attach(stream: Any) -> None:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("distrun: %(message)s"))
        root.addHandler(handler)
        added.append(handler)

    yield attach
    for handler in added:
        root.removeHandler(handler)


def test_progress_text() -> None:
    assert str(Progress("connecting", 128, 96)) == "connecting 96/128 hosts"
    assert str(Progress("connecting", 128, 96, 1)) == "connecting 96/128 hosts, 1 failed"


def test_one_line_updates_in_place_and_is_gone_at_the_end(terminal: Terminal, log_to: Any) -> None:
    log_to(terminal.stream)
    names = [f"h{i}" for i in range(1, 9)]
    with progress_line(terminal.stream) as line:
        assert line.enabled
        fan_out(names, lambda name, window: name, lambda _: None, policy=ALL_OR_NOTHING, limit=3,
                phase="connecting", progress=line)  # fmt: skip
        assert terminal.shown() == ["connecting 8/8 hosts"]  # one line, redrawn, not eight
        assert b"connecting 0/8 hosts" in terminal.raw and b"connecting 5/8 hosts" in terminal.raw
    print("next output", file=terminal.stream, flush=True)
    assert terminal.shown() == ["next output"]


def test_log_records_erase_the_line_first(terminal: Terminal, log_to: Any) -> None:
    log_to(terminal.stream)
    with progress_line(terminal.stream) as line:
        line(Progress("connecting", 4, 1))
        logging.getLogger("launcher.test").warning("Permanently added h2 to known_hosts")
        line(Progress("connecting", 4, 2))
        assert terminal.shown() == ["distrun: Permanently added h2 to known_hosts", "connecting 2/4 hosts"]


def test_failures_are_counted_and_the_line_cleared_before_the_error(terminal: Terminal) -> None:
    def work(name: str, window: Window) -> str:
        if name == "h2":
            raise HostError("h2: connection refused")
        return name

    with pytest.raises(HostError), progress_line(terminal.stream) as line:
        fan_out(["h1", "h2"], work, lambda _: None, policy=ALL_OR_NOTHING, limit=1, phase="connecting",
                progress=line)  # fmt: skip
    assert terminal.shown() == []
    assert b", 1 failed" in terminal.raw  # the CLI's error line will start on a clean line


def test_never_longer_than_the_terminal_is_wide(terminal: Terminal) -> None:
    with progress_line(terminal.stream) as line:
        line.show("x" * 200)
        assert terminal.shown() == ["x" * (COLUMNS - 1)]  # no wrap, so `\r` still reaches its start


def test_silent_on_a_pipe() -> None:
    read_end, write_end = os.pipe()
    with open(write_end, "w") as pipe, progress_line(pipe) as line:
        assert not line.enabled
        line(Progress("connecting", 2, 1))
    with open(read_end, "rb") as f:
        assert f.read() == b""
    buffer = io.StringIO()
    with progress_line(buffer) as line:
        line(Progress("connecting", 2, 1))
    assert buffer.getvalue() == ""
