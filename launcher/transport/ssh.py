"""Run a host's agent over one SSH channel of an already authenticated paramiko connection."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.config import SshOptions
from launcher.errors import HostError
from launcher.hosts import Host
from launcher.progress import ProgressFn
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

    def close_input(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._channel.shutdown_write()  # the agent sees EOF on stdin

    def close(self) -> None:
        self.close_input()
        self._channel.close()
        self._client.close()

    def abort(self) -> None:
        # The socket goes first: a host that vanished mid-transfer leaves its send buffer full, and closing
        # the channel would wait for room to send its CLOSE message (minutes, until TCP gives up).
        sock = self._channel.get_transport().sock if self._channel.get_transport() else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError, EOFError):
            self._channel.close()
        self._client.close()


def open_links(
    clients: Mapping[str, paramiko.SSHClient],
    pythons: Sequence[str],
    *,
    limit: int,
    progress: ProgressFn | None = None,
) -> dict[str, SshLink]:
    """Start the agent on every connected host, at most `limit` session starts at once: each makes sshd fork
    a session and a login shell on the host, the costliest part of a start on the host's side.

    All or nothing: if any host refuses, the links already made are dropped and HostError names that host.
    """
    from launcher.transport.sshconn import Aborted, Window, fan_out

    sources = shipped_sources()

    def start(name: str, window: Window) -> SshLink:
        try:
            with window.slot():
                return SshLink(name, clients[name], pythons, sources)
        except Aborted:
            raise
        except Exception as exc:  # paramiko raises several unrelated types; each becomes one line here
            raise HostError(
                f"host {name}: cannot start the distrun agent: {exc or 'channel refused'}", host=name
            ) from exc

    names = list(clients)
    return fan_out(names, start, SshLink.abort, limit=limit, phase="starting agents", progress=progress)


class SshTransport:
    """Remote hosts over SSH: connect to all in parallel, then one agent channel each, both within a window
    of `options.max_parallel` hosts at a time.

    `pythons`: the interpreters to try for the agent, in order (see `remote_command`). `progress` hears how
    far connecting and starting agents got, after every host.
    """

    def __init__(
        self, options: SshOptions, pythons: Sequence[str], progress: ProgressFn | None = None
    ) -> None:
        self._options = options
        self._pythons = list(pythons)
        self._progress = progress

    def open(self, hosts: Sequence[Host]) -> dict[str, Link]:
        from launcher.transport.sshconn import connect_all  # paramiko is slow to import: only when needed

        clients = connect_all(hosts, self._options, self._progress)
        try:
            links = open_links(
                clients, self._pythons, limit=self._options.max_parallel, progress=self._progress
            )
        except BaseException:
            for client in clients.values():
                client.close()
            raise
        return dict(links)
