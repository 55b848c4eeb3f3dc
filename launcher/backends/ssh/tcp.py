"""What the launcher's own TCP connection to a host is told and can tell about an outage (Linux).

After a network outage TCP's retransmission back-off (RTO doubling: 0.2, 0.4, ... 3.2, 6.4 s) holds each
side's first bytes back until its next retransmission, so an 8 s outage could be heard as 13 s of silence,
past the 10 s that makes a host lost. Two remedies, both on our end of the connection, since the host's end
is its sshd's:

- `cap_backoff`: our retransmissions come at least every RETRANSMIT_CAP seconds (TCP_RTO_MAX_MS, Linux 6.15
  and later), so once the network is back the agent hears us within that time, not after TCP's doubling.
- `acked_ago`: the host's kernel acknowledging our retransmission proves the network is back before its own
  back-off lets its agent's bytes through; the launcher counts that as word from the host, for a while.
"""

from __future__ import annotations

import contextlib
import socket
import struct

# Not yet in Python's socket module (Linux 6.15, include/uapi/linux/tcp.h).
TCP_RTO_MAX_MS = 44
RETRANSMIT_CAP = 1.0  # seconds; above the round trip of any network a cluster runs on

# struct tcp_info: eight one-byte fields, then u32s; tcpi_last_ack_recv (milliseconds) is the 13th u32.
_LAST_ACK_RECV = struct.Struct("=I")
_LAST_ACK_RECV_OFFSET = 8 + 12 * 4
_INFO_SIZE = 104


def cap_backoff(sock: socket.socket) -> bool:
    """Retransmit at least every RETRANSMIT_CAP seconds; False where the kernel cannot (then TCP doubles)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, int(RETRANSMIT_CAP * 1000))
    except OSError:
        return False
    return True


def acked_ago(sock: socket.socket) -> float | None:
    """Seconds since the peer's kernel last acknowledged anything we sent; None where TCP_INFO says nothing
    (not Linux, a closed socket)."""
    info_opt = getattr(socket, "TCP_INFO", None)
    if info_opt is None:
        return None
    with contextlib.suppress(OSError):
        info = sock.getsockopt(socket.IPPROTO_TCP, info_opt, _INFO_SIZE)
        if len(info) >= _LAST_ACK_RECV_OFFSET + _LAST_ACK_RECV.size:
            return float(_LAST_ACK_RECV.unpack_from(info, _LAST_ACK_RECV_OFFSET)[0]) / 1000.0
    return None
