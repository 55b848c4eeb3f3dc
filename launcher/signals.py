"""Signals on the launcher: which ones distrun handles, their names, and waiting on fds or a signal.

Handlers never run job logic: while `signal_pipe` is active each signal only writes one byte on a pipe, and
the loop that waits (`Waiter`) reads those bytes and acts on them, between the other events it waits for.
Stdlib only, imported by the errors and the result records.
"""

from __future__ import annotations

import os
import selectors
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

# Signals that stop the job (distrun exits 128+N), signals passed on to every rank while the job goes on, and
# job control (Ctrl-Z, fg). docs/usage.md's "Signals" table says the same.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
HANDLED_SIGNALS = (*STOP_SIGNALS, *FORWARDED_SIGNALS, signal.SIGTSTP, signal.SIGCONT)

D = TypeVar("D")


@contextmanager
def signal_pipe(signums: Sequence[int] = HANDLED_SIGNALS) -> Iterator[int]:
    """While active, the returned fd becomes readable with one byte per signal received."""
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, lambda *_: None) for signum in caught(signums)}
    try:
        yield read_fd
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(old_wakeup)
        os.close(read_fd)
        os.close(write_fd)


def caught(signums: Sequence[int]) -> list[int]:
    """The signals distrun may catch: not those it inherited ignored. `nohup distrun` must survive SIGHUP,
    and a background job of a non-interactive shell ignores SIGINT and SIGQUIT, as users of both expect."""
    return [signum for signum in signums if signal.getsignal(signum) is not signal.SIG_IGN]


def read_signals(wake_fd: int) -> bytes:
    try:
        return os.read(wake_fd, 64)
    except BlockingIOError:
        return b""


def stopping(received: bytes) -> bytes:
    """The signals among `received` that stop the job, in arrival order."""
    return bytes(signum for signum in received if signum in STOP_SIGNALS)


def suspend_self() -> None:
    """Stop this process as Ctrl-Z would have, had we not caught it; returns when `fg` continues us."""
    os.kill(os.getpid(), signal.SIGSTOP)


class Waiter(Generic[D]):
    """Wait on these fds or a signal: a selector that always watches `signal_pipe`'s fd as well.

    Each registration carries a value (a host, a name); `wait` gives the signals received meanwhile and the
    values of the registrations that became readable, so a loop handles both without knowing the pipe.
    """

    def __init__(self, wake_fd: int) -> None:
        self.wake_fd = wake_fd
        self._sel = selectors.DefaultSelector()
        self._sel.register(wake_fd, selectors.EVENT_READ)

    def __enter__(self) -> Waiter[D]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sel.close()

    def register(self, fileobj: Any, data: D) -> None:
        """Watch `fileobj` (an fd or an object with fileno()) for reading; `wait` reports it as `data`."""
        self._sel.register(fileobj, selectors.EVENT_READ, data)

    def unregister(self, fileobj: Any) -> None:
        self._sel.unregister(fileobj)

    def wait(self, timeout: float | None) -> tuple[bytes, list[D]]:
        """Block until something is readable, a signal arrives or `timeout` seconds pass: the signals (one
        byte each, b"" for none) and the ready registrations' values, in the order the selector gave them."""
        received = b""
        ready: list[D] = []
        for key, _ in self._sel.select(timeout):
            if key.fd == self.wake_fd:
                received += read_signals(self.wake_fd)
            else:
                ready.append(key.data)
        return received, ready
