"""The launcher's side of one agent connection, whatever carries it."""

from __future__ import annotations

from typing import Protocol


class Link(Protocol):
    """A byte pipe to one host's agent.

    `fileno()` is selectable: readable when `recv()` has data or the link closed (`recv()` then returns b"").
    """

    host: str
    remote: bool

    def fileno(self) -> int: ...

    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes | None:
        """Data, b"" once closed, or None when the wake-up brought nothing to read (yet)."""
        ...

    def diagnostics(self) -> str:
        """What the agent wrote to its stderr, for messages when it dies unexpectedly."""
        ...

    def close(self) -> None:
        """Close our end (the agent sees EOF and stops its ranks) and release resources."""
        ...

    def abort(self) -> None:
        """Last resort when the agent does not finish: drop the connection / kill the agent process."""
        ...
