"""Open one authenticated SSH connection per host, the way OpenSSH would, or fail with a one-line reason.

`connect_target` opens one resolved target (`launcher.backends.ssh.config`) through its ProxyJump hops or its
ProxyCommand, checking host keys (`launcher.backends.ssh.hostkeys`), and retries only what is worth retrying:
sshd's MaxStartups drops bursts of handshakes as resets or missing banners, while a wrong key or a changed
host key will not get better. `open_all` connects many hosts at once within the adaptive `Window`, all or
nothing (`launcher.backends.fanout`): on any failure it closes whatever it already opened before raising
`HostError`, so a failed launch leaves nothing behind. Not supported: ControlMaster.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import paramiko

from launcher.backends.fanout import ALL_OR_NOTHING, fan_out
from launcher.backends.ssh.config import SshTarget, routes
from launcher.backends.ssh.hostkeys import HostKeyPolicy, UnknownHostKey, changed_key_reason, trust_known_keys
from launcher.backends.ssh.options import SshOptions
from launcher.backends.window import Aborted, Window
from launcher.core.hosts import Host
from launcher.core.progress import ProgressFn
from launcher.errors import HostError, UsageError

log = logging.getLogger(__name__)

MAX_BACKOFF = 2.0

PARAMIKO_LOG = f"{__name__}.paramiko"

T = TypeVar("T")


class _ParamikoAsDebug(logging.Filter):
    """Shows paramiko's records only when our logger is at DEBUG, and as DEBUG.

    paramiko logs every handshake sshd drops (and we retry) as an ERROR with a traceback; we report failures
    ourselves in one line, so its records are detail for debugging.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not log.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


logging.getLogger(PARAMIKO_LOG).addFilter(_ParamikoAsDebug())


class SshClient(paramiko.SSHClient):
    """An SSHClient that knows its target and closes the jump-host connections it was tunnelled through."""

    def __init__(self) -> None:
        super().__init__()
        self.jumps: list[paramiko.SSHClient] = []
        self.target: SshTarget | None = None

    @property
    def peer_addr(self) -> str | None:
        """The address this connection reached, or None when tunnelled (ProxyJump/ProxyCommand).

        Through a tunnel the socket's peer is the jump host or a pipe, not the target: callers that need the
        target's address must ask the target itself.
        """
        transport = self.get_transport()
        sock = getattr(transport, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                return str(sock.getpeername()[0])
        return None

    def close(self) -> None:
        super().close()
        for jump in reversed(self.jumps):
            jump.close()
        self.jumps = []


class _Transient(Exception):
    """A failure worth another attempt (dropped by MaxStartups, reset during the handshake)."""


class AuthRefused(HostError):
    """The host answered but took none of the keys (or not the password): `distrun ssh-setup` fixes that."""


class _Refused(Exception):
    """A failure no retry will fix; its message is the reason shown to the user."""


class _AuthRefused(_Refused):
    """The host refused every key, or the password, offered."""


def _key_candidates(target: SshTarget) -> tuple[list[str], bool]:
    """Key files to offer, and whether paramiko should also try ssh-agent and ~/.ssh/id_*."""
    files = [str(p) for p in target.identity_files if p.is_file()]
    # IdentitiesOnly restricts authentication to the configured files, as OpenSSH does.
    return files, not target.identities_only


def _open_socket(target: SshTarget, timeout: float, via: paramiko.SSHClient | None) -> Any:
    if via is not None:
        transport = via.get_transport()
        if transport is None:
            raise _Refused("jump host connection closed")
        try:
            return transport.open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            raise _Refused(f"jump host cannot reach {target.hostname}:{target.port}: {exc.text}") from exc
    if target.proxy_command is not None:
        return paramiko.ProxyCommand(target.proxy_command)
    try:
        return socket.create_connection((target.hostname, target.port), timeout=timeout)
    except socket.gaierror as exc:
        raise _Refused(f"cannot resolve host name {target.hostname!r} ({exc.strerror})") from exc
    except TimeoutError as exc:
        raise _Refused(
            f"unreachable: no answer from {target.hostname}:{target.port} within {timeout:g}s"
        ) from exc
    except ConnectionRefusedError as exc:
        raise _Refused(f"connection refused by {target.hostname}:{target.port} (is sshd running?)") from exc
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
            raise _Refused(f"unreachable: {target.hostname}:{target.port}: {exc.strerror}") from exc
        raise _Transient(f"cannot connect to {target.hostname}:{target.port}: {exc}") from exc


def _connect_once(
    target: SshTarget, options: SshOptions, via: paramiko.SSHClient | None, password: str | None = None
) -> SshClient:
    """One attempt; with `password` (distrun ssh-setup only) that is the one method offered, no keys."""
    timeout = options.connect_timeout
    key_files, use_defaults = _key_candidates(target) if password is None else ([], False)
    sock = _open_socket(target, timeout, via)
    client = SshClient()
    started = time.monotonic()
    try:
        if target.host_key_policy != "ignore":
            trust_known_keys(client, target)
        client.set_missing_host_key_policy(HostKeyPolicy(target))
        client.set_log_channel(PARAMIKO_LOG)
        name = target.host_key_alias or target.hostname
        # `hostname` only names the known_hosts entry here: the socket is already connected.
        client.connect(
            hostname=name,
            port=target.port,
            username=target.user,
            # paramiko takes a list although its stubs say str.
            key_filename=key_files or None,  # type: ignore[arg-type]
            allow_agent=use_defaults,
            look_for_keys=use_defaults,
            password=password,
            sock=sock,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
        )
    except BaseException as exc:
        client.close()
        with contextlib.suppress(Exception):
            sock.close()
        if isinstance(exc, Exception):
            classified = _classify(target, exc, key_files, by_password=password is not None)
            if isinstance(classified, _Transient) and time.monotonic() - started >= timeout * 0.9:
                # It waited out the whole timeout (no banner, say): no burst sshd dropped, which is quick to
                # say so, but a peer that does not speak SSH. Retrying would only wait as long again.
                classified = _Refused(
                    f"unreachable: no SSH answer from {target.hostname}:{target.port} within {timeout:g}s "
                    "(is an SSH server listening there?)"
                )
            raise classified from exc
        raise
    transport = client.get_transport()
    if transport is not None and options.keepalive_interval > 0:
        transport.set_keepalive(max(1, round(options.keepalive_interval)))
    return client


def _classify(
    target: SshTarget, exc: Exception, key_files: list[str], by_password: bool = False
) -> Exception:
    """Turn what paramiko raised into _Refused (final) or _Transient (retry) with a readable reason."""
    if isinstance(exc, _Refused | _Transient):
        return exc
    if isinstance(exc, UnknownHostKey):
        return _Refused(str(exc))
    if by_password and isinstance(exc, paramiko.BadAuthenticationType):
        allowed = ", ".join(exc.allowed_types) or "none"
        return _AuthRefused(
            f"user {target.user} cannot log in with a password there (the host allows: {allowed})"
        )
    if by_password and isinstance(exc, paramiko.AuthenticationException):
        return _AuthRefused(f"password refused for user {target.user}")
    if isinstance(exc, paramiko.BadHostKeyException):
        return _Refused(changed_key_reason(target, exc))
    if isinstance(exc, paramiko.PasswordRequiredException):
        return _Refused(
            f"authentication refused for {target.user}: a key is encrypted; add it to ssh-agent ({exc})"
        )
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc):
        # paramiko's way of saying it found no key at all to offer: final, like a refused key.
        where = "the configured identity files" if target.identities_only else "ssh-agent or ~/.ssh/id_*"
        return _AuthRefused(f"authentication refused for user {target.user}: no usable key in {where}")
    if isinstance(exc, paramiko.AuthenticationException):
        tried = [*key_files]
        if not target.identities_only:
            tried = ["ssh-agent", *tried, "~/.ssh/id_*"]
        return _AuthRefused(
            f"authentication refused for user {target.user} (tried {', '.join(tried) or 'no keys'})"
        )
    if isinstance(exc, TimeoutError | socket.timeout):
        return _Refused(f"unreachable: SSH handshake with {target.hostname}:{target.port} timed out")
    if isinstance(exc, ConnectionResetError | EOFError | paramiko.SSHException | OSError):
        # sshd's MaxStartups answers an excess handshake by closing the socket: a missing banner or a reset.
        return _Transient(
            f"SSH handshake with {target.hostname}:{target.port} failed: {exc or type(exc).__name__}"
        )
    return exc


def _backoff(attempt: int) -> float:
    # Jitter spreads the retries of a burst that sshd dropped all at once.
    return min(MAX_BACKOFF, 0.1 * 2.0**attempt) * random.uniform(0.5, 1.5)


# A connection's socket, and the pipe pair paramiko makes for its agent channel's fileno().
FILES_PER_HOST = 3


def ensure_open_files(needed: int) -> None:
    """Raise this process's soft limit on open files towards the hard limit where `needed` more may not fit.

    The usual soft limit of 1024 is met at about 300 hosts; the hard limit is typically far higher.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256  # what the launcher itself, its logs and local agents hold
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log.debug("open files limit raised from %d to %d", soft, new)


def _connect_with_retries(
    target: SshTarget,
    options: SshOptions,
    window: Window,
    via: paramiko.SSHClient | None = None,
    password: str | None = None,
) -> SshClient:
    """`options.retries` more attempts after transient failures of handshakes that had the window to
    themselves; a drop among several handshakes in flight is congestion, which the window answers, so it is
    retried for free, within `retries + 1` connect timeouts in all."""
    budget = options.retries
    give_up_at = time.monotonic() + options.connect_timeout * (options.retries + 1)
    attempt = 0
    while True:
        attempt += 1
        ticket = None
        try:
            with window.slot() as ticket:
                client = _connect_once(target, options, via, password)
            window.completed()
            return client
        except _Transient as exc:
            assert ticket is not None
            window.dropped(ticket)
            if window.aborted.is_set():
                raise Aborted from exc
            if not ticket.crowded:
                budget -= 1
            if budget < 0 or time.monotonic() >= give_up_at:
                raise _Refused(f"{exc} (after {attempt} attempts)") from exc
            delay = _backoff(min(attempt - 1, 8))
            log.debug("%s: %s; retrying in %.2fs", target.host, exc, delay)
            if window.aborted.wait(delay):
                raise Aborted from exc


def connect_target(
    target: SshTarget,
    options: SshOptions,
    jumps: Sequence[SshTarget] = (),
    window: Window | None = None,
    password: str | None = None,
) -> SshClient:
    """Connect to one resolved target through `jumps` (first hop first); raises HostError naming the host.

    `password` authenticates the target (not the jump hosts) by password instead of keys.
    """
    window = window or Window(1)
    opened: list[SshClient] = []
    hop_name = target.host
    try:
        via: paramiko.SSHClient | None = None
        for jump in jumps:
            hop_name = jump.host
            via = _connect_with_retries(jump, options, window, via)
            opened.append(via)
        hop_name = target.host
        final = _connect_with_retries(target, options, window, via, password)
    except BaseException as exc:
        for client in reversed(opened):
            client.close()
        if isinstance(exc, _Refused):
            where = f" (via jump host {hop_name})" if hop_name != target.host else ""
            error = AuthRefused if isinstance(exc, _AuthRefused) and not where else HostError
            raise error(f"{target.host}: {exc}{where}", host=target.host) from exc
        raise
    # Closing the target's connection must also close the tunnels beneath it.
    final.jumps = list(opened)
    final.target = target
    return final


def connect_all(
    hosts: Sequence[Host], options: SshOptions, progress: ProgressFn | None = None
) -> dict[str, paramiko.SSHClient]:
    """One authenticated connection per distinct host name, at most `options.max_parallel` handshakes at a
    time; all or nothing. `progress` hears how far it got ("connecting") after every host.

    Raises HostError (exit 3) for the first failing host in the order given, after closing every connection
    already opened; UsageError for a bad ssh config or a missing identity file.
    """
    return open_all(hosts, options, lambda _, client: client, lambda client: client.close(), progress)


def open_all(
    hosts: Sequence[Host],
    options: SshOptions,
    then: Callable[[str, paramiko.SSHClient], T],
    close: Callable[[T], None],
    progress: ProgressFn | None = None,
    *,
    phase: str = "connecting",
) -> dict[str, T]:
    """`connect_all`, with `then(name, client)` run on each host as soon as its own connection is up, outside
    the handshake window (which bounds handshakes only): one host's session starts while others are still
    shaking hands. On any failure every result is closed with `close` (and a client `then` failed on, too).
    """
    for path in options.identity_files:
        if not path.expanduser().is_file():
            raise UsageError(f"identity file {path} does not exist")
    found = routes(hosts, options)
    ensure_open_files(FILES_PER_HOST * len(found))

    def connect(name: str, window: Window) -> T:
        route = found[name]
        client = connect_target(route.target, options, route.jumps, window)
        try:
            return then(name, client)
        except BaseException:
            client.close()
            raise

    group = fan_out(
        list(found),
        connect,
        close,
        policy=ALL_OR_NOTHING,
        limit=options.max_parallel,
        phase=phase,
        progress=progress,
        # Threads busy with `then` hold no handshake slot: twice as many keep the window full meanwhile.
        threads=2 * options.max_parallel,
    )
    return dict(group.succeeded)
