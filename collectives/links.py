"""The TCP connections of this process's process groups, and how to break them all at once.

A gloo collective waits on its peers' sockets with no way in torch to end the wait early: neither
``ProcessGroupGloo.abort()`` nor ``shutdown()`` wakes a pending work, so a peer whose link was cut keeps
every survivor blocked until the group's timeout. An elastic reset cannot wait that long. The connections a
group opens appear while it is created (gloo connects its full mesh eagerly, the store's client connects at
once), so each creation is wrapped in :func:`owned`, which remembers the sockets that appeared meanwhile.
:func:`cut` shuts them down: every wait on them ends at once with gloo's "Connection closed by peer", on
every thread (the caller's, the engine's, gloo's own), and the peers' waits on the other end end too.
Sockets the script opened itself are never among them, apart from one opened on another thread during a
group's creation.

A cut also reaches a group still being created (an elastic reset's new world, whose member died before it
formed): the sockets that appeared since its creation began are shut down too, so its rendezvous fails at
once instead of waiting out the group's timeout. A connect still waiting for its peer (a host beyond a cut
link drops the SYN) is aborted, and so is each one gloo opens again in its place (it retries a failed
connect with a new socket) until the creation ends. A creation that begins after a cut fails at once as well
(:class:`~collectives.errors.HorovodInternalError`), until :func:`rearm` says a new world is named.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from collectives.errors import HorovodInternalError

__all__ = ["cut", "forget", "owned", "rearm"]

_FDS = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
_owned: set[int] = set()
_forming: list[set[int]] = []  # for each creation under way, the sockets there were before it began
_severed = False  # cut since the last new world was named
_lock = threading.Lock()
_TCP_SYN_SENT = 2  # tcp_info's state of a connect waiting for its peer's answer
CHASE_S = 0.1  # how often a creation still under way after a cut is cut again (gloo's connect retries)


class _Unspecified(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_char * 14)]


def _socket_inodes() -> dict[int, int]:
    """File descriptor -> inode, for every socket this process has open."""
    found: dict[int, int] = {}
    for name in os.listdir(_FDS):
        try:
            info = os.fstat(int(name))
        except (OSError, ValueError):
            continue  # closed since the listing
        if stat.S_ISSOCK(info.st_mode):
            found[int(name)] = info.st_ino
    return found


@contextmanager
def owned() -> Iterator[None]:
    """Remember the sockets that appear while the body runs (a process group's creation) as the groups'."""
    before = set(_socket_inodes().values())
    with _lock:
        if _severed:
            raise HorovodInternalError("a peer of this world is gone: its process group cannot form")
        _forming.append(before)
    try:
        yield
    finally:
        appeared = set(_socket_inodes().values()) - before
        with _lock:
            _forming[:] = [other for other in _forming if other is not before]
            _owned.update(appeared)


def rearm() -> None:
    """A new world is named: groups may form again (until the next cut)."""
    global _severed
    with _lock:
        _severed = False


def forget() -> None:
    """The groups are gone: their sockets (closed, or about to be) are no longer ours to cut."""
    with _lock:
        _owned.clear()


def _shut(fd: int) -> bool:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False  # closed since the listing
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return False
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False  # a listener (the store's server): its thread must not see accept fail
        if _connecting(sock):
            return _abort_connect(fd)
        sock.getpeername()
        sock.shutdown(socket.SHUT_RDWR)  # on the socket itself, so the group's own descriptor sees it
        return True
    except OSError:
        return False  # not connected, or already shut
    finally:
        sock.close()


def _connecting(sock: socket.socket) -> bool:
    info = getattr(socket, "TCP_INFO", None)
    return info is not None and sock.getsockopt(socket.IPPROTO_TCP, info, 1)[0] == _TCP_SYN_SENT


def _abort_connect(fd: int) -> bool:
    """End a connect under way (shutdown() cannot: nothing is connected yet): connect() to AF_UNSPEC
    dissolves the association, and the connect's waiter sees an error at once (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    address = _Unspecified(socket.AF_UNSPEC)
    return int(libc.connect(fd, ctypes.byref(address), ctypes.sizeof(address))) == 0


def cut() -> int:
    """Shut down every connected TCP socket of the groups (see :func:`owned`), those of a creation under way
    included; the number shut down. Safe from any thread, and again: a socket shut down already is skipped."""
    global _severed
    with _lock:
        _severed = True
        mine = set(_owned)
        forming = list(_forming)
    shut = _cut(mine, forming)
    if forming:
        threading.Thread(target=_chase, args=(forming,), name="collectives-cut", daemon=True).start()
    return shut


def _cut(mine: set[int], forming: list[set[int]]) -> int:
    inodes = _socket_inodes()
    mine = mine | {inode for inode in inodes.values() if any(inode not in before for before in forming)}
    return sum(_shut(fd) for fd, inode in inodes.items() if inode in mine)


def _chase(forming: list[set[int]]) -> None:
    """Cut the creations under way at the cut again, every CHASE_S, until they ended or a new world is named:
    gloo connects again with a new socket where a connect failed."""
    while True:
        time.sleep(CHASE_S)  # gloo says nothing when it opens a socket: look again
        with _lock:
            still = [before for before in _forming if any(before is other for other in forming)]
            if not _severed or not still:
                return
        _cut(set(), still)
