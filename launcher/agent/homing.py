"""An agent that dials home: it connects to the launcher over TCP instead of talking on its stdin/stdout.

Shipped with `launcher.agent.protocol` and `launcher.agent.server` (see `launcher.backends.bootstrap`),
stdlib-only,
Python 3.7. Whoever started it (one `srun` step for every node, say) gives every agent the same invitation on
stdin, after the shipped sources: one JSON line with the launcher's addresses, its port and the job's secret.
The secret never appears on a command line or in an environment, so `ps` on the node does not show it, and the
ranks do not inherit it.

The handshake proves both ends know the secret without sending it (HMAC-SHA256 over fresh nonces), so nothing
else can join the job as an agent, and an agent takes orders only from its own launcher:

    agent    -> launcher: "DISTRUN-HOME 1 <name> <agent nonce>\\n"
    launcher -> agent:    "<launcher nonce> <HMAC(secret, "launcher" agent-nonce name)>\\n"
    agent    -> launcher: "<HMAC(secret, "agent" launcher-nonce name)>\\n"

Then the connection carries the protocol exactly as a pipe or an SSH channel does: MAGIC, HELLO, frames,
heartbeats; its EOF (the launcher gone, even by SIGKILL: the kernel closes its sockets) stops the ranks.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

GREETING = b"DISTRUN-HOME 1"
LINE_MAX = 4096
# How long each of the launcher's addresses gets to accept the connection and finish the handshake.
DIAL_TIMEOUT = 10.0


def proof(secret: bytes, role: bytes, nonce: str, name: str) -> str:
    """What `role` ("launcher" or "agent") sends to show it knows the secret, bound to the other's nonce."""
    return hmac.new(secret, role + b" " + nonce.encode() + b" " + name.encode(), hashlib.sha256).hexdigest()


def nonce() -> str:
    return binascii.hexlify(os.urandom(16)).decode()


def read_line(read: Callable[[int], bytes], limit: int = LINE_MAX) -> tuple[bytes, bytes]:
    """A line (without its newline) from `read(n) -> bytes`, and whatever came after it in the same reads."""
    buf = b""
    while b"\n" not in buf:
        chunk = read(limit)
        if not chunk:
            raise EOFError("closed before the end of a line")
        buf += chunk
        if len(buf) > limit:
            raise ValueError("line too long")
    line, rest = buf.split(b"\n", 1)
    return line, rest


def dial(invitation: dict[str, Any], name: str) -> socket.socket:
    """A connection to the launcher, authenticated both ways; OSError naming every address tried if none.

    The launcher lists its addresses best first (the one that routes to the nodes); the rest are fallbacks.
    """
    secret = binascii.unhexlify(str(invitation["secret"]))
    port = int(str(invitation["port"]))
    errors = []
    for addr in invitation["addrs"]:
        try:
            sock = socket.create_connection((addr, port), timeout=DIAL_TIMEOUT)
        except OSError as exc:
            errors.append(f"{addr}: {exc.strerror or exc}")
            continue
        try:
            mine = nonce()
            sock.sendall(GREETING + f" {name} {mine}\n".encode())
            line, _ = read_line(sock.recv)
            theirs, their_proof = line.decode().split(" ", 1)
            if not hmac.compare_digest(their_proof, proof(secret, b"launcher", mine, name)):
                raise ValueError("it does not know this job's secret")
            sock.sendall(proof(secret, b"agent", theirs, name).encode() + b"\n")
        except (OSError, EOFError, ValueError) as exc:
            sock.close()
            errors.append(f"{addr}: {exc}")
            continue
        sock.settimeout(None)
        return sock
    raise OSError("cannot reach the launcher at port {} ({})".format(port, "; ".join(errors)))


def main() -> int:
    from launcher.agent.server import serve

    # The node as Slurm, and so distrun, names it: messages say the same name as distrun's own.
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        line, _ = read_line(lambda n: os.read(0, n))
        invitation = json.loads(line.decode())
        sock = dial(invitation, name)
    except (OSError, EOFError, ValueError) as exc:
        sys.stderr.write(f"distrun: agent on {name}: {exc}\n")
        return 3
    # Nothing more comes on stdin; whatever the agent starts must not read what its starter sends there.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    code = serve(sock.fileno(), sock.fileno())
    # Its ranks are gone and the launcher told: the interpreter's teardown would only delay the step's end.
    sys.stderr.flush()
    os._exit(code)
