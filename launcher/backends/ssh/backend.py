"""The `ssh` backend: a host's agent over one SSH channel of an authenticated paramiko connection; names
that are this machine (as SSH would resolve them) run through a local agent instead."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from launcher.agent.protocol import READ_SIZE
from launcher.backends.api import Backend, CheckedLink
from launcher.backends.bootstrap import agent_pythons, remote_command, shipped_sources
from launcher.backends.link import Link
from launcher.backends.locality import (
    current_user,
    is_local_host,
    local_addresses,
    refuse_this_machine_twice,
    runs_here,
)
from launcher.backends.ssh.options import SSH_OPTIONS, SshOptions, parse_ssh_options, ssh_options
from launcher.backends.ssh.tcp import acked_ago, cap_backoff
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.core.progress import ProgressFn
from launcher.errors import HostError

if TYPE_CHECKING:
    import paramiko


class SshLink:
    """One channel per host, whatever its rank count: sshd's MaxSessions (10) never limits the job."""

    heartbeat = True

    def __init__(self, host: str, client: paramiko.SSHClient, command: str, sources: Sequence[bytes]) -> None:
        self.host = host
        self._client = client
        transport = client.get_transport()
        assert transport is not None
        # Through a ProxyJump tunnel the socket is a channel, and neither address means anything here.
        self.peer_addr: str | None = getattr(client, "peer_addr", None)
        self.local_addr: str | None = None
        self._sock: socket.socket | None = None
        if isinstance(transport.sock, socket.socket):
            self._sock = transport.sock
            self.local_addr = str(transport.sock.getsockname()[0])
            cap_backoff(transport.sock)
        self._channel = transport.open_session()
        # Only our own constant bootstrap goes through the remote shell; user data travels in frames.
        self._channel.exec_command(command)
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

    def acked_ago(self) -> float | None:
        """Seconds since the host's kernel acknowledged our bytes (see launcher.backends.ssh.tcp); None
        through a tunnel, whose acknowledgements are the jump host's."""
        return acked_ago(self._sock) if self._sock is not None else None

    def diagnostics(self) -> str:
        self._drain_stderr()
        return self._stderr.decode(errors="replace").strip()

    def said_so_far(self) -> str:
        return self.diagnostics()

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


def start_agent(name: str, client: paramiko.SSHClient, command: str, sources: Sequence[bytes]) -> SshLink:
    """The agent on a connected host: one session channel, whose login shell runs on the host meanwhile.
    `command` is `remote_command(pythons, sources)`, the same for every host: made once per launch, as its
    digests of the sources are.

    Raises HostError naming the host if the session is refused.
    """
    try:
        return SshLink(name, client, command, sources)
    except Exception as exc:  # paramiko raises several unrelated types; each becomes one line here
        raise HostError(
            f"host {name}: cannot start the distrun agent: {exc or 'channel refused'}", host=name
        ) from exc


class SshTransport:
    """Remote hosts over SSH: at most `options.max_parallel` handshakes at a time, and each host's agent
    channel opened as soon as that host's own handshake is done, outside the window: a host's login shell
    (conda, pyenv, modules: often the slowest part of a start) runs while other hosts still shake hands, and
    never holds a slot.

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
        from launcher.backends.ssh.connect import open_all  # paramiko is slow to import: only when needed

        sources = shipped_sources()
        command = remote_command(self._pythons, sources)
        links = open_all(
            hosts,
            self._options,
            lambda name, client: start_agent(name, client, command, sources),
            SshLink.abort,
            self._progress,
            phase="starting agents",
        )
        return dict(links)


def _error_kind(message: str, auth: bool) -> str:
    if auth:
        return "auth"
    if "CHANGED" in message:
        return "host-key"
    if "unreachable" in message or "refused" in message or "resolve" in message:
        return "unreachable"
    return "other"


class SshBackend(Backend):
    """`--launcher ssh` (the default outside Slurm)."""

    name = "ssh"
    options = SSH_OPTIONS

    def parse_options(self, values: Mapping[str, Any], label: Callable[[str], str]) -> SshOptions:
        return parse_ssh_options(values, label)

    def local_hosts(self, hosts: Sequence[Host], config: LaunchConfig) -> list[bool]:
        """Which hosts are this machine (they run through a local agent, without SSH).

        A host named with another user (`nobody@localhost`) is never local: only SSH runs it as that user.
        Two entries that are both this machine are refused (HostSpecError): they would share ports and
        LOCAL_RANKs.
        """
        me = current_user()
        local = [runs_here(h, me) for h in hosts]
        if not all(local):
            from launcher.backends.ssh.config import load_ssh_config, resolve_target

            # Judge by what SSH would connect to: ~/.ssh/config may map `node1` to an address, or to here.
            ssh_config = load_ssh_config(ssh_options(config).config_file)
            mine = (
                local_addresses()
            )  # once: listing every interface, per host, was 1.2 s of 256 hosts' launch
            local = [
                is_local
                or (
                    h.user in (None, me)
                    and is_local_host(resolve_target(h, ssh_options(config), ssh_config).hostname, mine)
                )
                for h, is_local in zip(hosts, local, strict=True)
            ]
        refuse_this_machine_twice(hosts, local)
        return local

    def local_by_name(self, hosts: Sequence[Host]) -> list[bool]:
        return [runs_here(h) for h in hosts]

    def open(
        self, hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None
    ) -> dict[str, Link]:
        return SshTransport(ssh_options(config), agent_pythons(config.python), progress).open(hosts)

    def open_for_check(self, host: Host, config: LaunchConfig) -> CheckedLink:
        """Also says whether the host key was known, and which step failed (login, or the agent's start)."""
        from launcher.backends.ssh.config import routes
        from launcher.backends.ssh.connect import AuthRefused, connect_target
        from launcher.backends.ssh.hostkeys import has_known_key

        route = routes([host], ssh_options(config))[host.name]
        target = route.target
        known = target.host_key_policy == "ignore" or has_known_key(target)
        started = time.monotonic()
        try:
            client = connect_target(target, ssh_options(config), route.jumps)
        except HostError as err:
            return CheckedLink(
                None, error=str(err), error_kind=_error_kind(str(err), isinstance(err, AuthRefused))
            )
        login = time.monotonic() - started
        key = "unchecked" if target.host_key_policy == "ignore" else ("known" if known else "recorded")
        try:
            sources = shipped_sources()
            command = remote_command(agent_pythons(config.python), sources)
            link = start_agent(host.name, client, command, sources)
        except HostError as err:
            client.close()
            return CheckedLink(None, login_s=login, host_key=key, error=str(err), error_kind="other")
        return CheckedLink(link, login_s=login, host_key=key)


BACKEND = SshBackend()
