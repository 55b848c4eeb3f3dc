"""Whether the launcher's machine still answers on the agent's connection while the launcher says nothing.

A stopped process (Ctrl-Z, SIGSTOP) sends nothing, but its kernel keeps its connections up and goes on
acknowledging what arrives for it; a machine cut off by a network outage, or powered off, acknowledges
nothing. So an agent that waits for a stopped launcher can still tell when to give up.

The connection is the agent's own socket where it dialed home (srun), or its sshd's in an SSH session: the
host's TCP socket whose addresses SSH_CONNECTION names, read through the kernel's sock_diag interface, which
answers any user. Through a ProxyJump the connection is the jump host's, which answers for the launcher.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections.abc import Mapping
from typing import Tuple  # noqa: UP035 - Python 3.7 runs this

# struct tcp_info (include/uapi/linux/tcp.h) up to tcpi_last_ack_recv: eight one-byte fields, then u32s.
_TCP_INFO = struct.Struct("=8B13I")
_STATE, _RETRANSMITS, _PROBES = 0, 2, 3
_UNACKED, _LAST_ACK_RECV = 8 + 4, 8 + 12
_ESTABLISHED = 1

# sock_diag (include/uapi/linux/sock_diag.h, inet_diag.h, netlink.h).
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_NLMSGHDR = struct.Struct("=IHHII")
_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2 before its sockid
_MSG = struct.Struct("=BBBB")  # inet_diag_msg before its sockid
_SOCKID = struct.Struct("!HH16s16s")  # ports and addresses, network order; then the interface and cookie
_SOCKID_SIZE = 48
_MSG_SIZE = 72
_RTATTR = struct.Struct("=HH")

# An address as 16 bytes (IPv4 as mapped into IPv6), and a port. typing.Tuple: a runtime value on 3.7.
Endpoint = Tuple[bytes, int]  # noqa: UP006


def answering(info: bytes, patience: float) -> bool | None:
    """Judge a connection by its tcp_info: False when what we sent has waited longer than `patience` seconds
    for an acknowledgement (retransmitted, or probing a shut window unanswered); True when the peer's kernel
    acknowledged recently or nothing waits for it; None when there is nothing to judge by (not established:
    the close itself will say it)."""
    if len(info) < _TCP_INFO.size:
        return None
    fields = _TCP_INFO.unpack_from(info)
    if fields[_STATE] != _ESTABLISHED:
        return None
    if fields[_LAST_ACK_RECV] / 1000.0 <= patience:
        return True
    waiting = fields[_RETRANSMITS] or fields[_PROBES] or fields[_UNACKED]
    return not waiting


def launcher_answering(fd: int, patience: float, environ: Mapping[str, str] | None = None) -> bool | None:
    """Whether the launcher's machine acknowledges what this agent sends it (see `answering`), over the
    connection behind `fd` (the agent's input); None where no TCP connection can be found (a pipe)."""
    info = _own_socket_info(fd)
    if info is None:
        ends = _ssh_connection(os.environ if environ is None else environ)
        if ends is not None:
            info = diag_info(*ends)
    return None if info is None else answering(info, patience)


def _own_socket_info(fd: int) -> bytes | None:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    with sock, contextlib.suppress(OSError):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    return None


def _address(text: str) -> bytes | None:
    """16 bytes: an IPv6 address, or an IPv4 one mapped into IPv6 (as a dual-stack sshd's socket has it)."""
    with contextlib.suppress(OSError, ValueError):
        return b"\0" * 10 + b"\xff\xff" + socket.inet_pton(socket.AF_INET, text)
    with contextlib.suppress(OSError, ValueError):
        return socket.inet_pton(socket.AF_INET6, text.split("%", maxsplit=1)[0])
    return None


def _ssh_connection(environ: Mapping[str, str]) -> tuple[Endpoint, Endpoint] | None:
    """sshd's socket of this session, as (this host's end, the client's end), from SSH_CONNECTION
    ("client-address client-port server-address server-port")."""
    parts = environ.get("SSH_CONNECTION", "").split()
    if len(parts) != 4 or not (parts[1].isdigit() and parts[3].isdigit()):
        return None
    client, server = _address(parts[0]), _address(parts[2])
    if client is None or server is None:
        return None
    return (server, int(parts[3])), (client, int(parts[1]))


def _mapped(family: int, raw: bytes) -> bytes:
    return b"\0" * 10 + b"\xff\xff" + raw[:4] if family == socket.AF_INET else raw


def diag_info(local: Endpoint, remote: Endpoint) -> bytes | None:
    """The tcp_info of this host's established TCP socket from `local` to `remote`, whoever owns it; None
    where there is none or the kernel does not say."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for msg_family, sockid, info in _dump(family):
            sport, dport, src, dst = _SOCKID.unpack_from(sockid)
            ends = ((_mapped(msg_family, src), sport), (_mapped(msg_family, dst), dport))
            if ends == (local, remote) and info is not None:
                return info
    return None


def _dump(family: int) -> list[tuple[int, bytes, bytes | None]]:
    """Every established TCP socket of `family` on this host: its family, its sockid and its tcp_info."""
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 1 << _ESTABLISHED)
    request += b"\0" * _SOCKID_SIZE
    header = _NLMSGHDR.pack(
        _NLMSGHDR.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
    )
    found: list[tuple[int, bytes, bytes | None]] = []
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return found
    with sock, contextlib.suppress(OSError):
        sock.settimeout(1.0)
        sock.sendto(header + request, (0, 0))
        while True:
            data = sock.recv(1 << 16)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind = _NLMSGHDR.unpack_from(data, offset)[:2]
                if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < _NLMSGHDR.size:
                    return found
                body = data[offset + _NLMSGHDR.size : offset + length]
                if len(body) >= _MSG_SIZE:
                    sockid = body[_MSG.size : _MSG.size + _SOCKID_SIZE]
                    found.append((body[0], sockid, _attribute(body[_MSG_SIZE:], _INET_DIAG_INFO)))
                offset += (length + 3) & ~3
            if not data:
                return found
    return found


def _attribute(data: bytes, wanted: int) -> bytes | None:
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            return None
        if kind == wanted:
            return data[offset + _RTATTR.size : offset + length]
        offset += (length + 3) & ~3
    return None
