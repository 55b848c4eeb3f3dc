"""distrun's own stdout and stderr, written at the file-descriptor level in the order things arrived.

Chunks are queued and written with os.write when the relay flushes (once per supervisor loop turn), so a busy
job costs one system call per turn, not one per line; a switch between stdout and stderr writes out what the
other stream had queued first, so one rank's stdout and stderr keep the order the agent read them in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from typing import Literal

Stream = Literal["stdout", "stderr"]
log = logging.getLogger(__name__)
# Buffers one writev takes (POSIX guarantees at least 16; Linux takes 1024).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16


def guard_std_fds() -> None:
    """Give a closed stdin/stdout/stderr (`distrun ... >&-`) /dev/null before anything else takes its number.

    Otherwise the next pipe or socket opened would become "stdout" and receive the job's output. Python left
    sys.stdout/sys.stderr as None for a closed one; they get a stream again, so nothing fails writing to it.
    """
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


def same_terminal(out_fd: int, err_fd: int) -> bool:
    """True when stdout and stderr are one terminal: the only case where a status area can be drawn."""
    try:
        if not (os.isatty(out_fd) and os.isatty(err_fd)):
            return False
        a, b = os.fstat(out_fd), os.fstat(err_fd)
    except OSError:
        return False
    return stat.S_ISCHR(a.st_mode) and (a.st_dev, a.st_ino, a.st_rdev) == (b.st_dev, b.st_ino, b.st_rdev)


class Console:
    """Queues console bytes per stream and writes them out in arrival order.

    With `merged`, both streams go to stdout's descriptor (they are one terminal), so a status area drawn
    there and the lines scrolling above it can never be reordered.
    """

    def __init__(self, out_fd: int, err_fd: int, *, merged: bool = False) -> None:
        self._fds: dict[str, int] = {"stdout": out_fd, "stderr": out_fd if merged else err_fd}
        self._queued: list[bytes | memoryview] = []
        self._queued_fd = -1

    def write(self, stream: str, *data: bytes | memoryview) -> None:
        fd = self._fds.get(stream)
        if fd is None:
            return
        if fd != self._queued_fd:
            self.flush()
            self._queued_fd = fd
        self._queued.extend(data)

    def flush(self) -> None:
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        fd = self._queued_fd
        # The protocol's, which travels with the agent; imported here, not above, as the CLI imports this
        # module and `distrun --help` need not load the protocol (about 10 ms).
        from launcher.agent.protocol import write_all

        try:
            # One gathering system call, without first copying everything into one buffer.
            done = os.writev(fd, queued) if 1 < len(queued) <= _IOV_MAX else 0
            if done < sum(map(len, queued)):
                write_all(fd, b"".join(queued)[done:])
        except BlockingIOError:
            write_all(fd, b"".join(queued))
        except OSError:
            self._closed(fd)

    def _closed(self, fd: int) -> None:
        """The reader of our stdout/stderr went away (`distrun ... | head`): the job goes on unseen.

        Stopping hours of training because a pager was closed would be worse than losing the rest of the
        view; --output-dir files still get everything.
        """
        streams = [name for name, stream_fd in self._fds.items() if stream_fd == fd]
        for name in streams:
            del self._fds[name]
        # Python would otherwise complain about the unflushable stream at exit; logging must not fail either.
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        for name in streams:
            log.warning("console %s closed; the job continues and its %s is no longer shown", name, name)


def use_color(choice: bool | None) -> bool:
    """--color/--no-color where given, else colours only on a terminal and never with NO_COLOR."""
    if choice is not None:
        return choice
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ
