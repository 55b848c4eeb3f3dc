"""The launcher's end of agents that dial home (`launcher.agent.homing`): a listening socket, a per-job
secret, the handshake that admits only agents knowing it, a `Link` over each admitted connection, and the one
process that starts them all.

Whoever starts the agents (one `srun` step for every node; a PBS or LSF job, a cloud VM's start script; an
agent starting others, for a tree) hands each the `invitation` on its stdin; `Home.gather` then waits until
every expected agent has dialed in and proven itself, or names the first host that did not. `DialHomeStep`
is that start for a backend whose one process (`Starter`) runs the same command on every host and forwards
its stdin to each: the backend says only that process's argv.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import re
import selectors
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.agent.homing import GREETING, LINE_MAX, nonce, proof
from launcher.agent.protocol import ORPHAN_GRACE_CAP, READ_SIZE, write_all
from launcher.backends.bootstrap import HOMING, remote_command, shipped_sources
from launcher.backends.link import opening
from launcher.core.progress import Progress, ProgressFn, StallDeadline
from launcher.errors import HostError

log = logging.getLogger(__name__)

# A connection that has not finished the handshake this long after it opened is dropped: nothing that knows
# the secret is that slow, and a stranger must not hold a slot.
HANDSHAKE_TIMEOUT = 10.0
# How long the step may take to end once every agent has gone, and after its starter is asked to cancel it.
STEP_END_WAIT = 5.0
# The wait for agents to dial in gives up when none has for this long (the starter may queue the step
# meanwhile, as srun does).
DIAL_STALL = 60.0


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


def dial_addresses(toward: str) -> list[str]:
    """This machine's addresses the agents may dial, best first: the one that routes to `toward` (a node),
    then every other that is not loopback or link-local, then loopback (a node may be this machine)."""
    import psutil

    best: list[str] = []
    with contextlib.suppress(OSError):
        for family, _, _, _, sockaddr in socket.getaddrinfo(toward, 9, type=socket.SOCK_DGRAM):
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                best.append(str(s.getsockname()[0]))
            break
    rest: list[str] = []
    loopback: list[str] = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(a.address.split("%")[0])
            if ip.is_link_local:
                continue
            (loopback if ip.is_loopback else rest).append(str(ip))
    return list(dict.fromkeys([*best, *rest, *loopback]))


@dataclass(frozen=True)
class Starter:
    """The one process that runs every host's agent: it runs `command` (a POSIX shell command) on each of
    `names` and forwards its own stdin to every copy, as `srun` does for the tasks of a step."""

    name: str  # as messages name it: "srun"
    argv: Callable[[Sequence[str], Sequence[str]], list[str]]  # (names, command) -> the starter's argv
    # Its lines that only restate what the agents said better (the last line is what a failure shows).
    noise: re.Pattern[str] | None = None


class DialHomeStep:
    """The starter's process running every agent; links share it, and the last one closed ends it."""

    def __init__(self, names: Sequence[str], pythons: Sequence[str], starter: Starter) -> None:
        self.starter = starter
        self.home = Home(names, dial_addresses(names[0]))
        sources = shipped_sources()
        command = ["/bin/sh", "-c", remote_command(pythons, sources, HOMING)]
        # A file, not a pipe: nobody need read the starter's output while the job runs for it never to block.
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - closed when the step ends
        self._proc = subprocess.Popen(
            starter.argv(names, command),
            stdin=subprocess.PIPE,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the terminal's Ctrl-C reaches only distrun
        )
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):  # the starter already exited: gather() reports why
            for source in sources:
                write_all(self._proc.stdin.fileno(), source)
            write_all(self._proc.stdin.fileno(), self.home.invitation())
        # Every agent has its bootstrap: EOF tells the starter there is no more to forward.
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        self.links: list[SocketLink] = []

    def ended(self) -> str | None:
        code = self._proc.poll()
        return None if code is None else f"{self.starter.name} exited with code {code}"

    def diagnostics(self) -> str:
        """The agents' and the starter's last words (all hosts together), without the starter's
        restatements."""
        self._output.seek(0)
        said = self._output.read().decode(errors="replace").splitlines()
        noise = self.starter.noise
        lines = [line for line in said if line.strip() and not (noise and noise.match(line))]
        return lines[-1] if lines else ""

    def gather(self, progress: ProgressFn | None) -> dict[str, SocketLink]:
        links = self.home.gather(DIAL_STALL, self.ended, self.diagnostics, progress)
        self.links = list(links.values())
        for link in self.links:
            link.on_closed = self._link_closed
        return links

    def _link_closed(self) -> None:
        if all(link.closed for link in self.links):
            self.end()

    def end(self) -> None:
        """Let the step finish (its agents are gone or going); else cancel it (a starter answers SIGTERM by
        killing every agent it started, wherever it runs); else kill the starter."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(STEP_END_WAIT)
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(STEP_END_WAIT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._output.close()


def open_step(
    names: Sequence[str], pythons: Sequence[str], starter: Starter, progress: ProgressFn | None = None
) -> dict[str, SocketLink]:
    """A link per host of `names`, each to an agent its starter ran that dialed home; all or nothing: on a
    failure the step is ended and HostError names the failing host."""
    try:
        step = DialHomeStep(names, pythons, starter)
    except OSError as err:
        raise HostError(
            f"host {names[0]}: cannot run {starter.name}: {err.strerror or err}", host=names[0]
        ) from None
    try:
        return step.gather(progress)
    except BaseException:
        step.end()
        raise
