"""Run a host's agent over one SSH channel of an already authenticated paramiko connection."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.config import SshOptions
from launcher.errors import HostError
from launcher.hosts import Host
from launcher.protocol import READ_SIZE
from launcher.transport.bootstrap import remote_command, shipped_sources
from launcher.transport.link import Link

if TYPE_CHECKING:
    import paramiko


class SshLink:
    """One channel per host, whatever its rank count: sshd's MaxSessions (10) never limits the job."""

    heartbeat = True

    def __init__(
        self, host: str, client: paramiko.SSHClient, pythons: Sequence[str], sources: Sequence[bytes]
    ) -> None:
        self.host = host
        self._client = client
        transport = client.get_transport()
        assert transport is not None
        # Through a ProxyJump tunnel the socket is a channel, and neither address means anything here.
        self.peer_addr: str | None = getattr(client, "peer_addr", None)
        self.local_addr: str | None = None
        if isinstance(transport.sock, socket.socket):
            self.local_addr = str(transport.sock.getsockname()[0])
        self._channel = transport.open_session()
        # Only our own constant bootstrap goes through the remote shell; user data travels in frames.
        self._channel.exec_command(remote_command(pythons, sources))
        for source in sources:
            self._channel.sendall(source)
        self._stderr = bytearray()

    def fileno(self) -> int:
        return self._channel.fileno()

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._channel.sendall(data)

    def recv(self) -> bytes | None:
        self._drain_stderr()
        channel = self._channel
        # paramiko wakes fileno() for stderr too; a bare recv() would then block until stdout has data.
        if not (channel.recv_ready() or channel.eof_received or channel.closed):
            return None
        try:
            return channel.recv(READ_SIZE)
        except (OSError, EOFError):
            return b""

    def _drain_stderr(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            while self._channel.recv_stderr_ready():
                self._stderr += self._channel.recv_stderr(READ_SIZE)

    def diagnostics(self) -> str:
        self._drain_stderr()
        return self._stderr.decode(errors="replace").strip()

    def close(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._channel.shutdown_write()  # the agent sees EOF on stdin
        self._channel.close()
        self._client.close()

    def abort(self) -> None:
        self._channel.close()
        self._client.close()


def open_links(clients: Mapping[str, paramiko.SSHClient], pythons: Sequence[str]) -> dict[str, SshLink]:
    """Start the agent on every connected host at once (each exec waits for sshd to start a session).

    All or nothing: if any host refuses, the links already made are dropped and HostError names that host.
    """
    links: dict[str, SshLink] = {}
    failures: dict[str, BaseException] = {}
    sources = shipped_sources()

    def start(name: str, client: paramiko.SSHClient) -> None:
        try:
            links[name] = SshLink(name, client, pythons, sources)
        except Exception as exc:  # paramiko raises several unrelated types; each becomes one line below
            failures[name] = exc

    threads = [
        threading.Thread(target=start, args=item, name=f"agent-start-{item[0]}", daemon=True)
        for item in clients.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        for link in links.values():
            link.abort()
        name = next(n for n in clients if n in failures)
        raise HostError(f"host {name}: cannot start the distrun agent: {failures[name] or 'channel refused'}")
    return links


class SshTransport:
    """Remote hosts over SSH: connect to all in parallel, then one agent channel each.

    `pythons`: the interpreters to try for the agent, in order (see `remote_command`).
    """

    def __init__(self, options: SshOptions, pythons: Sequence[str]) -> None:
        self._options = options
        self._pythons = list(pythons)

    def open(self, hosts: Sequence[Host]) -> dict[str, Link]:
        from launcher.transport.sshconn import connect_all  # paramiko is slow to import: only when needed

        clients = connect_all(hosts, self._options)
        try:
            return dict(open_links(clients, self._pythons))
        except BaseException:
            for client in clients.values():
                client.close()
            raise
