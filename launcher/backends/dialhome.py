"""The launcher's end of agents that dial home (`launcher.agent.homing`): a listening socket, a per-job
secret,
the handshake that admits only agents knowing it, and a `Link` over each admitted connection.

Whoever starts the agents (one `srun` step for every node; an agent starting others, for a tree) hands each
the `invitation` on its stdin; `Home.gather` then waits until every expected agent has dialed in and proven
itself, or names the first host that did not.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import selectors
import socket
import time
from collections.abc import Callable, Sequence

from launcher.agent.homing import GREETING, LINE_MAX, nonce, proof
from launcher.agent.protocol import ORPHAN_GRACE_CAP, READ_SIZE
from launcher.backends.link import opening
from launcher.core.progress import Progress, ProgressFn, StallDeadline
from launcher.errors import HostError

log = logging.getLogger(__name__)

# A connection that has not finished the handshake this long after it opened is dropped: nothing that knows
# the secret is that slow, and a stranger must not hold a slot.
HANDSHAKE_TIMEOUT = 10.0


def _listen() -> socket.socket:
    """A socket on a free port of every address of this machine (IPv6 and IPv4 at once where possible)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
    sock.listen(min(socket.SOMAXCONN, 4096))
    return sock


def _plain(addr: str) -> str:
    """An IPv4 peer of a dual-stack socket shows as ::ffff:a.b.c.d."""
    return addr.removeprefix("::ffff:")


class _Caller:
    """A connection in the middle of the handshake."""

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.since = now
        self.buf = b""
        self.name: str | None = None  # set once the greeting is answered
        self.challenge = ""


class SocketLink:
    """An admitted agent's connection: the protocol's bytes, both ways, as over an SSH channel."""

    heartbeat = True  # a network between us can go silent without closing
    # After EOF the agent stops its ranks (within ORPHAN_GRACE_CAP) before it closes its end.
    close_wait = ORPHAN_GRACE_CAP + 1.0

    def __init__(self, host: str, sock: socket.socket, early: bytes, diagnostics: Callable[[], str]) -> None:
        self.host = host
        self._sock = sock
        self._early = early  # what the agent sent right behind its proof (MAGIC, HELLO)
        self._diagnostics = diagnostics
        self.peer_addr: str | None = _plain(str(sock.getpeername()[0]))
        self.local_addr: str | None = _plain(str(sock.getsockname()[0]))
        self.closed = False
        self.on_closed: Callable[[], None] | None = None  # told once, when this link is closed

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # the agent is gone; recv() reports it
            self._sock.sendall(data)

    def recv(self) -> bytes | None:
        data, self._early = self._early, b""
        try:
            # With early bytes in hand, only what is already there: the socket need not be readable.
            return data + self._sock.recv(READ_SIZE, socket.MSG_DONTWAIT if data else 0)
        except BlockingIOError:
            return data
        except OSError:
            return data  # b"" (closed) unless early bytes come first; the next call says closed

    def diagnostics(self) -> str:
        return self._diagnostics()

    def close_input(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)  # the agent sees EOF

    def close(self) -> None:
        """EOF, then wait (bounded) for the agent to close its end: it is stopping its ranks meanwhile."""
        self.close_input()
        deadline = time.monotonic() + self.close_wait
        with contextlib.suppress(OSError), selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0 and sel.select(left):
                if not self._sock.recv(READ_SIZE):
                    break
        self.abort()

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._sock.close()
        if self.on_closed is not None:
            self.on_closed()


class Home:
    """Where this job's agents dial in: a listening socket on every address, and the job's secret."""

    def __init__(self, names: Sequence[str], addresses: Sequence[str]) -> None:
        self._secret = os.urandom(32)
        self._expected = list(names)
        self._addresses = list(addresses)
        self._listener = _listen()
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])

    def invitation(self) -> bytes:
        """The line each agent reads on its stdin: where to dial, and the secret (never on a command line)."""
        body = {"addrs": self._addresses, "port": self.port, "secret": self._secret.hex()}
        return json.dumps(body).encode() + b"\n"

    def gather(
        self,
        stall: float,
        starter_gone: Callable[[], str | None],
        diagnostics: Callable[[], str],
        progress: ProgressFn | None = None,
    ) -> dict[str, SocketLink]:
        """A link per expected host once every agent has dialed in and proven itself.

        Gives up (HostError naming the first missing host) when no agent has arrived for `stall` seconds or
        when `starter_gone()` says whatever started the agents has ended (its text: why).
        """
        callers: dict[int, _Caller] = {}
        started = time.monotonic()
        deadline = StallDeadline(stall, started)
        try:
            with opening(SocketLink.abort) as arrived, selectors.DefaultSelector() as sel:
                sel.register(self._listener, selectors.EVENT_READ)
                while len(arrived) < len(self._expected):
                    remaining = deadline.remaining(time.monotonic())
                    self._check(arrived, remaining, stall, starter_gone, diagnostics)
                    for key, _ in sel.select(min(0.1, remaining)):
                        if key.fileobj is self._listener:
                            self._accept(sel, callers)
                            continue
                        link = self._answer(sel, callers, key.fd, arrived, diagnostics)
                        if link is not None:
                            log.debug(
                                "%s: agent dialed in after %.3fs", link.host, time.monotonic() - started
                            )
                            arrived[link.host] = link
                            deadline.progressed(time.monotonic())
                            if progress is not None:
                                progress(Progress("starting agents", len(self._expected), len(arrived)))
                    self._drop_slow(sel, callers)
        finally:
            for caller in callers.values():
                caller.sock.close()
            self._listener.close()
        return {name: arrived[name] for name in self._expected}

    def _check(
        self,
        arrived: dict[str, SocketLink],
        remaining: float,
        stall: float,
        starter_gone: Callable[[], str | None],
        diagnostics: Callable[[], str],
    ) -> None:
        """HostError naming the first missing host if the starter has ended or the wait has stalled."""
        missing = next(n for n in self._expected if n not in arrived)
        gone = starter_gone()
        if gone is not None:
            detail = diagnostics() or gone
            raise HostError(
                f"host {missing}: the distrun agent exited before answering: {detail}", host=missing
            )
        if remaining <= 0:
            raise HostError(
                f"host {missing}: no distrun agent dialed in within {stall:g}s "
                f"({len(arrived)} of {len(self._expected)} did)",
                host=missing,
            )

    def _answer(
        self,
        sel: selectors.BaseSelector,
        callers: dict[int, _Caller],
        fd: int,
        arrived: dict[str, SocketLink],
        diagnostics: Callable[[], str],
    ) -> SocketLink | None:
        """The next step of one caller's handshake: its link once admitted; a refused caller is dropped."""
        caller = callers[fd]
        try:
            link = self._advance(caller, arrived, diagnostics)
        except (OSError, EOFError, ValueError) as err:
            log.debug("refused a connection: %s", err)
            sel.unregister(caller.sock)
            caller.sock.close()
            del callers[fd]
            return None
        if link is not None:
            sel.unregister(caller.sock)
            del callers[fd]
        return link

    @staticmethod
    def _drop_slow(sel: selectors.BaseSelector, callers: dict[int, _Caller]) -> None:
        now = time.monotonic()
        for fd, caller in list(callers.items()):
            if now - caller.since > HANDSHAKE_TIMEOUT:
                log.debug("dropped a connection that did not finish the handshake in time")
                sel.unregister(caller.sock)
                caller.sock.close()
                del callers[fd]

    def _accept(self, sel: selectors.BaseSelector, callers: dict[int, _Caller]) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                sock, _ = self._listener.accept()
                sock.setblocking(False)
                callers[sock.fileno()] = _Caller(sock, time.monotonic())
                sel.register(sock, selectors.EVENT_READ)

    def _advance(
        self, caller: _Caller, arrived: dict[str, SocketLink], diagnostics: Callable[[], str]
    ) -> SocketLink | None:
        """One step of a caller's handshake; its link once it is done. Raises when the caller is refused."""
        chunk = caller.sock.recv(LINE_MAX)
        if not chunk:
            raise EOFError("closed during the handshake")
        caller.buf += chunk
        while b"\n" in caller.buf:
            line, caller.buf = caller.buf.split(b"\n", 1)
            if caller.name is None:
                self._greet(caller, line.decode(errors="replace"), arrived)
                continue
            if not hmac.compare_digest(line.decode(errors="replace"), self._expected_proof(caller)):
                raise ValueError("it does not know this job's secret")
            caller.sock.setblocking(True)
            return SocketLink(caller.name, caller.sock, caller.buf, diagnostics)
        if len(caller.buf) > LINE_MAX:
            raise ValueError("line too long")
        return None

    def _greet(self, caller: _Caller, line: str, arrived: dict[str, SocketLink]) -> None:
        words = line.split(" ")
        if " ".join(words[:2]) != GREETING.decode() or len(words) != 4:
            raise ValueError("not a distrun agent's greeting")
        name, theirs = words[2], words[3]
        if name not in self._expected or name in arrived:
            raise ValueError(f"no agent expected from {name}")
        caller.name = name
        caller.challenge = nonce()
        answer = f"{caller.challenge} {proof(self._secret, b'launcher', theirs, name)}\n"
        caller.sock.sendall(answer.encode())

    def _expected_proof(self, caller: _Caller) -> str:
        assert caller.name is not None
        return proof(self._secret, b"agent", caller.challenge, caller.name)
