"""The seam between the launch loop and whatever carries an agent's bytes: `Link` and `Transport`, and
`opening`, which keeps a transport's promise of all links or none."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from launcher.core.hosts import Host

T = TypeVar("T")


class Link(Protocol):
    """A byte pipe to one host's agent.

    `fileno()` is selectable: readable when `recv()` has data or the link closed (`recv()` then returns b"").
    `heartbeat`: the link can go silent without closing (a network between us), so both ends exchange BEATs;
    a local pipe says everything by closing. `peer_addr`: the address this machine reached the host by;
    `local_addr`: this machine's address on the way there (both None when unknown, e.g. through a proxy).
    """

    host: str
    heartbeat: bool
    peer_addr: str | None
    local_addr: str | None

    def fileno(self) -> int: ...

    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes | None:
        """Data, b"" once closed, or None when the wake-up brought nothing to read (yet)."""
        ...

    def diagnostics(self) -> str:
        """What the agent wrote to its stderr, for messages when it dies unexpectedly."""
        ...

    def close_input(self) -> None:
        """Send EOF: the agent stops what still runs and exits. Returns at once; `close` may wait."""
        ...

    def close(self) -> None:
        """Close our end (the agent sees EOF and stops its ranks) and release resources."""
        ...

    def abort(self) -> None:
        """Last resort when the agent does not finish: drop the connection / kill the agent process."""
        ...


@runtime_checkable
class Acknowledging(Protocol):
    """A link whose transport shows when the host's machine last acknowledged our bytes (TCP's ACKs): after a
    network outage that proves the host reachable before its agent's first bytes get through."""

    def acked_ago(self) -> float | None:
        """Seconds since the last acknowledgement; None when unknown."""
        ...


@runtime_checkable
class Prefaced(Protocol):
    """A link whose agent starts from a login shell that may print first (SSH): what it said can be read
    while the link is open, unlike `Link.diagnostics`, which may wait for the agent's end."""

    def said_so_far(self) -> str:
        """Everything the host wrote on stderr until now, without waiting."""
        ...


def abort(link: Link) -> None:
    """`link.abort()`, as a callback: `Link.abort` itself is the protocol's empty stub, not the link's own."""
    link.abort()


class Transport(Protocol):
    """Starts one agent per host (local pipe, SSH, srun, ...)."""

    def open(self, hosts: Sequence[Host]) -> dict[str, Link]:
        """A link per host name, each with a running agent; all or nothing.

        On any failure every link already made is dropped and HostError names the failing host.
        """
        ...


@contextlib.contextmanager
def opening(close: Callable[[T], None]) -> Iterator[dict[str, T]]:
    """A dict to put each host's link (or any value) in as it is made; if the block raises, every value in
    it is closed. Many hosts at once on threads: `launcher.backends.fanout`."""
    made: dict[str, T] = {}
    try:
        yield made
    except BaseException:
        for value in made.values():
            close(value)
        raise
