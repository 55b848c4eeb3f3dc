"""In-process stand-ins for the launcher's side effects: links to agents that are scripts, not processes."""

from __future__ import annotations

import os
import tempfile

from launcher.agent.protocol import (
    DONE,
    EXIT,
    VERSION,
    Frame,
    FrameReader,
    Hello,
    RankExited,
    encode,
    encode_hello,
    encode_message,
)
from launcher.console.relay import LogOptions, LogRelay
from launcher.core.hosts import Host
from launcher.core.plan import Slot
from launcher.runtime.node import HostAttempt, Node


class FakeLink:
    """A Link whose agent is the test: `push` queues bytes for `recv`, `sent` records decoded frames."""

    def __init__(self, host: str, *, heartbeat: bool = False) -> None:
        self.host = host
        self.heartbeat = heartbeat
        self.peer_addr: str | None = None
        self.local_addr: str | None = None
        self.inbox: list[bytes] = []
        self.sent: list[Frame] = []
        self.aborted = self.closed = self.input_closed = False
        self._reader = FrameReader()
        self._r, self._w = os.pipe()  # selectable, for tests that run the real loop

    def push(self, data: bytes) -> None:
        self.inbox.append(data)
        os.write(self._w, b"x")

    def fileno(self) -> int:
        return self._r

    def send(self, data: bytes) -> None:
        self.sent.extend(self._reader.feed(data))

    def recv(self) -> bytes | None:
        os.read(self._r, 1)
        return self.inbox.pop(0) if self.inbox else None

    def diagnostics(self) -> str:
        return "agent said goodbye"

    def close_input(self) -> None:
        self.input_closed = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def kinds(self) -> list[int]:
        return [frame.kind for frame in self.sent]


def hello(version: int = VERSION) -> bytes:
    return encode_hello(Hello(version, 1))


def exited(rank: int, code: int) -> bytes:
    return encode_message(EXIT, RankExited(code), rank)


DONE_FRAME = encode(DONE)


def fake_hosts(ranks_per_host: dict[str, int], *, heartbeat: bool = False) -> list[HostAttempt]:
    """An attempt's hosts, each a Node over a FakeLink, with consecutive ranks assigned host by host."""
    hosts, rank = [], 0
    for index, (name, count) in enumerate(ranks_per_host.items()):
        host = Host(name, slots=count)
        node = Node(host, FakeLink(name, heartbeat=heartbeat), local=not heartbeat)
        hosts.append(HostAttempt(node, tuple(Slot(rank + i, i, index, host) for i in range(count))))
        rank += count
    return hosts


class CapturedFd:
    """A real file descriptor (the relay writes to descriptors) whose content a test reads back."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the test's relay

    def fileno(self) -> int:
        return self._file.fileno()

    def getvalue(self) -> bytes:
        return os.pread(self.fileno(), 1 << 20, 0)


def memory_relay(ranks: dict[int, str]) -> tuple[LogRelay, CapturedFd, CapturedFd]:
    out, err = CapturedFd(), CapturedFd()
    return LogRelay(out.fileno(), err.fileno(), ranks, LogOptions()), out, err
