"""Open one authenticated SSH connection per host, the way OpenSSH would, or fail with a one-line reason.

Resolution (`resolve_target`, pure) follows OpenSSH's precedence: what the user wrote (`user@host`, the port
and host key policy options) beats ~/.ssh/config, which beats the defaults. Connecting (`connect_all`, built
on `fan_out`) opens connections in parallel within an adaptive window (`Window`), retries only what is worth
retrying (sshd's MaxStartups drops bursts of handshakes as resets or missing banners; a wrong key or a changed
host key will not get better), reports progress after every host, and on any failure closes whatever it
already opened before raising `HostError`, so a failed launch leaves nothing behind.

Host keys are checked against known_hosts under the name OpenSSH uses: HostKeyAlias, else the HostName we
connect to, as `[name]:port` when the port is not 22 (hashed entries work). Policies:
  strict      unknown and changed keys are refused (StrictHostKeyChecking yes/ask)
  accept-new  unknown keys are appended to the user's known_hosts, changed keys refused (the default)
  ignore      any key is accepted and nothing is written (StrictHostKeyChecking no/off)

ProxyJump (each hop resolved through the same config) and ProxyCommand are supported. Not supported: Include
(paramiko ignores it), ControlMaster, host certificates, and a jump host's own ProxyJump: list every hop in
the target's ProxyJump instead.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import logging
import queue
import random
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from launcher.config import HostKeyPolicy, SshOptions
from launcher.errors import HostError, UsageError
from launcher.hosts import Host
from launcher.progress import Progress, ProgressFn

log = logging.getLogger(__name__)

SSH_PORT = 22
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
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

_STRICT_MAP: dict[str, HostKeyPolicy] = {
    "yes": "strict",
    # `ask` would prompt; a launcher cannot, and OpenSSH in batch mode refuses instead.
    "ask": "strict",
    "accept-new": "accept-new",
    # OpenSSH's `no` also connects when the key changed, so it is `ignore`, not accept-new.
    "no": "ignore",
    "off": "ignore",
}


@dataclass(frozen=True)
class SshTarget:
    """Everything needed to open one connection, resolved from the Host, ssh_config and SshOptions."""

    host: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...]
    host_key_policy: HostKeyPolicy
    proxy_jump: str | None = None
    # Known-hosts files that are read; new keys are appended to the first of `known_hosts_files`.
    known_hosts_files: tuple[Path, ...] = ()
    global_known_hosts_files: tuple[Path, ...] = ()
    host_key_alias: str | None = None
    identities_only: bool = False
    hash_known_hosts: bool = False
    proxy_command: str | None = None

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under in known_hosts."""
        name = self.host_key_alias or self.hostname
        return name if self.port == SSH_PORT else f"[{name}]:{self.port}"


# ------------------------------------------------------------------------------------------------- resolving


def load_ssh_config(path: Path | None) -> paramiko.SSHConfig | None:
    """Parse `path` (an explicit config, which must exist), else ~/.ssh/config plus /etc/ssh/ssh_config.

    Like OpenSSH's `-F`, an explicit file replaces both defaults. Returns None when there is no config at all.
    """
    if path is not None:
        files = [path.expanduser()]
        if not files[0].is_file():
            raise UsageError(f"ssh config file {path} does not exist")
    else:
        files = [p for p in (Path(USER_CONFIG).expanduser(), Path(SYSTEM_CONFIG)) if p.is_file()]
    if not files:
        return None
    key = tuple((file, _signature(file)) for file in files)
    config = _configs.get(key)
    if config is None:
        config = _MemoConfig()
        for file in files:
            try:
                with open(file) as f:
                    config.parse(f)
            except (OSError, paramiko.ConfigParseError, ValueError) as exc:
                raise UsageError(f"cannot read ssh config {file}: {exc}") from exc
        _configs[key] = config
    return config


class _MemoConfig(paramiko.SSHConfig):
    """Looks each host up once per process, for a config file unchanged since.

    paramiko matches a host against every Host block and asks getpass.getuser() for each block: about 10 ms
    per lookup with 256 hosts in ~/.ssh/config, and deciding which hosts are local and connecting both ask.
    """

    def __init__(self) -> None:
        super().__init__()
        self._memo: dict[str, paramiko.SSHConfigDict] = {}

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        found = self._memo.get(hostname)
        if found is None:
            found = self._memo[hostname] = super().lookup(hostname)
        return paramiko.SSHConfigDict(found)  # a copy: callers may change theirs


_configs: dict[tuple[tuple[Path, tuple[int, int, int]], ...], _MemoConfig] = {}


def _signature(path: Path) -> tuple[int, int, int]:
    """Changes whenever the file is replaced or written to."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _paths(value: Any) -> tuple[Path, ...]:
    """ssh_config file lists: one string with space-separated entries, or paramiko's list for IdentityFile."""
    items = value if isinstance(value, list) else str(value).split()
    return tuple(Path(item).expanduser() for item in items if item and item.lower() != "none")


def _yes(value: Any) -> bool:
    return str(value).lower() in ("yes", "true")


def resolve_target(host: Host, options: SshOptions, ssh_config: paramiko.SSHConfig | None) -> SshTarget:
    """Combine the host as written, the user's ssh config and the launcher's options; no I/O, no DNS."""
    cfg: dict[str, Any] = dict(ssh_config.lookup(host.name)) if ssh_config is not None else {}
    policy = options.host_key_policy
    if policy is None:
        strict = cfg.get("stricthostkeychecking")
        if strict is None:
            policy = "accept-new"
        else:
            try:
                policy = _STRICT_MAP[str(strict).lower()]
            except KeyError:
                raise UsageError(
                    f"{host.name}: unknown StrictHostKeyChecking value {strict!r} in ssh config"
                ) from None
    port_value = options.port if options.port is not None else cfg.get("port", SSH_PORT)
    try:
        port = int(port_value)
    except ValueError:
        raise UsageError(f"{host.name}: bad Port {port_value!r} in ssh config") from None
    user_known = (
        _paths(cfg["userknownhostsfile"]) if "userknownhostsfile" in cfg else _paths(list(USER_KNOWN_HOSTS))
    )
    if options.known_hosts_file is not None:
        user_known = (options.known_hosts_file.expanduser(),)
    global_known = _paths(cfg.get("globalknownhostsfile", list(GLOBAL_KNOWN_HOSTS)))
    proxy_jump = cfg.get("proxyjump")
    return SshTarget(
        host=host.name,
        hostname=str(cfg.get("hostname", host.name)),
        port=port,
        user=host.user or str(cfg.get("user") or getpass.getuser()),
        identity_files=(*options.identity_files, *_paths(cfg.get("identityfile", []))),
        host_key_policy=policy,
        proxy_jump=None if proxy_jump is None or str(proxy_jump).lower() == "none" else str(proxy_jump),
        known_hosts_files=user_known,
        global_known_hosts_files=global_known,
        host_key_alias=cfg.get("hostkeyalias"),
        identities_only=_yes(cfg.get("identitiesonly", "no")),
        hash_known_hosts=_yes(cfg.get("hashknownhosts", "no")),
        proxy_command=cfg.get("proxycommand"),
    )


@dataclass(frozen=True)
class JumpHop:
    """One `ProxyJump` hop as written; None means "what ssh config says"."""

    name: str
    user: str | None = None
    port: int | None = None


def parse_jump(spec: str) -> list[JumpHop]:
    """`ProxyJump` hops, first hop first: `[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://user@host:port`."""
    hops = []
    for raw in spec.split(","):
        item = raw.strip().removeprefix("ssh://")
        user, _, rest = item.rpartition("@")
        port: int | None = None
        if rest.startswith("["):
            name, _, tail = rest[1:].partition("]")
            if tail.startswith(":"):
                port = _parse_port(tail[1:], spec)
        elif rest.count(":") == 1:
            name, _, port_text = rest.partition(":")
            port = _parse_port(port_text, spec)
        else:
            name = rest
        if not name:
            raise UsageError(f"bad ProxyJump {spec!r}")
        hops.append(JumpHop(name=name, user=user or None, port=port))
    return hops


def _parse_port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"bad port in ProxyJump {spec!r}")
    return int(text)


def jump_targets(
    target: SshTarget, options: SshOptions, ssh_config: paramiko.SSHConfig | None
) -> list[SshTarget]:
    """The resolved hops of `target`'s ProxyJump, first hop first (pure)."""
    if target.proxy_jump is None:
        return []
    jumps = []
    for hop in parse_jump(target.proxy_jump):
        # A hop's port comes from the jump spec or its own config entry, never from the launcher's port
        # option, which (as ssh -p) is about the destination.
        hop_options = replace(options, port=hop.port)
        resolved = resolve_target(Host(name=hop.name, user=hop.user), hop_options, ssh_config)
        jumps.append(replace(resolved, proxy_jump=None, proxy_command=None))
    return jumps


# ------------------------------------------------------------------------------------------------ connecting


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


class _KnownHostsCache:
    """Each known_hosts file parsed once, not once per connection.

    paramiko parses a whole file whenever a client loads it, taking logging's global lock for every line: with
    256 hosts in one known_hosts that was three quarters of distrun's CPU while connecting, and quadratic. A
    file is parsed again only when it changed on disk; keys that we append ourselves are added in memory too.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._files: dict[Path, tuple[tuple[int, int, int], paramiko.HostKeys]] = {}

    def keys_for(self, files: Sequence[Path], name: str) -> dict[str, paramiko.PKey]:
        """The keys filed under `name` by type; the first file and line with a type wins, as in paramiko."""
        found: dict[str, paramiko.PKey] = {}
        with self.lock:
            for path in files:
                entries = self._load(path).lookup(name)
                for key_type in entries or ():
                    found.setdefault(key_type, entries[key_type])  # type: ignore[index]
        return found

    def added(self, path: Path, name: str, key: paramiko.PKey) -> None:
        """`path` got a line for `name` from us (call with `lock` held)."""
        self._load(path).add(name, key.get_name(), key)
        self._files[path] = (_signature(path), self._files[path][1])

    def _load(self, path: Path) -> paramiko.HostKeys:
        signature = _signature(path)
        cached = self._files.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        keys = paramiko.HostKeys()
        with contextlib.suppress(OSError):
            keys.load(str(path))
        self._files[path] = (signature, keys)
        return keys


_known_hosts = _KnownHostsCache()


class _AuthRefused(_Refused):
    """The host refused every key, or the password, offered."""


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Decides about keys in no known_hosts file; for changed keys paramiko raises BadHostKeyException."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        target = self.target
        if target.host_key_policy == "ignore":
            log.debug("%s: accepting host key %s unchecked", target.host, _fingerprint(key))
            return
        if target.host_key_policy == "strict":
            where = target.known_hosts_files[0] if target.known_hosts_files else Path(USER_KNOWN_HOSTS[0])
            raise _Refused(
                f"host key for {hostname} ({_fingerprint(key)}) is not in {where} and host key checking is "
                f"strict; after checking the fingerprint add it"
                f" (`ssh-keyscan -p {target.port} {target.hostname} >> {where}`) or use the accept-new policy"
            )
        _append_known_host(target, hostname, key)


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def _append_known_host(target: SshTarget, name: str, key: paramiko.PKey) -> None:
    if not target.known_hosts_files:
        return
    path = target.known_hosts_files[0]
    entry = paramiko.HostKeys.hash_host(name) if target.hash_known_hosts else name
    with _known_hosts.lock:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
        _known_hosts.added(path, name, key)
    log.warning("Permanently added %s (%s) to %s", name, _fingerprint(key), path)


def _files_with_key(target: SshTarget, name: str) -> list[Path]:
    found = []
    for path in (*target.known_hosts_files, *target.global_known_hosts_files):
        keys = paramiko.HostKeys()
        with contextlib.suppress(OSError):
            keys.load(str(path))
        if keys.lookup(name) is not None:
            found.append(path)
    return found


def has_known_key(target: SshTarget) -> bool:
    """Whether a known_hosts file already lists the host (`distrun check` reports new keys as recorded)."""
    return bool(_files_with_key(target, target.known_hosts_name))


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
            # Into the client's own key set, which paramiko checks but never writes back to any file.
            files = (*target.global_known_hosts_files, *target.known_hosts_files)
            name = target.known_hosts_name
            for key_type, key in _known_hosts.keys_for(files, name).items():
                client.get_host_keys().add(name, key_type, key)
        client.set_missing_host_key_policy(_HostKeyPolicy(target))
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
    if by_password and isinstance(exc, paramiko.BadAuthenticationType):
        allowed = ", ".join(exc.allowed_types) or "none"
        return _AuthRefused(
            f"user {target.user} cannot log in with a password there (the host allows: {allowed})"
        )
    if by_password and isinstance(exc, paramiko.AuthenticationException):
        return _AuthRefused(f"password refused for user {target.user}")
    if isinstance(exc, paramiko.BadHostKeyException):
        name = target.known_hosts_name
        files = _files_with_key(target, name) or list(target.known_hosts_files[:1])
        fix = " or ".join(f"`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(p))}`" for p in files)
        return _Refused(
            f"host key for {name} has CHANGED (now {_fingerprint(exc.key)},"
            f" known {_fingerprint(exc.expected_key)}); this may be an attack, or the host was reinstalled:"
            f" if expected, remove the old key with {fix}"
        )
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


class Aborted(Exception):
    """Another host failed first, so this one was not (or no longer) tried."""


@dataclass(frozen=True)
class Ticket:
    """One handshake's place in the window: the congestion epoch it started in, and whether it had company."""

    epoch: int
    crowded: bool


class Window:
    """How many handshakes may be in flight at once (pdsh's fan-out), adapting as TCP's congestion window.

    It opens at `limit`. A dropped handshake halves it: sshd's MaxStartups answers a burst of handshakes by
    closing some of them at random, and retries that arrive as one burst again are dropped again, while fewer
    at a time get through. All drops among handshakes started before the last halving are one congestion
    event and halve it once. Each completed handshake widens it by 1/size (by one per window's worth of
    completions), up to `limit`. A host waiting for a slot is not timing out yet: each attempt's timeout
    starts with its handshake, so the time a launch may take grows with the host count by itself. `abort()`
    wakes every waiter: once one host failed, nothing new starts.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.size = float(self.limit)
        self.in_flight = 0
        self.epoch = 0
        self.aborted = threading.Event()
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def slot(self) -> Iterator[Ticket]:
        with self._cond:
            while self.in_flight >= int(self.size) and not self.aborted.is_set():
                self._cond.wait()
            if self.aborted.is_set():
                raise Aborted
            self.in_flight += 1
            ticket = Ticket(self.epoch, crowded=self.in_flight > 1)
        try:
            yield ticket
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def dropped(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket.epoch == self.epoch:
                self.size = max(1.0, self.size / 2)
                self.epoch += 1

    def completed(self) -> None:
        with self._cond:
            self.size = min(float(self.limit), self.size + 1 / self.size)
            self._cond.notify_all()

    def abort(self) -> None:
        self.aborted.set()
        with self._cond:
            self._cond.notify_all()


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
    ssh_config = load_ssh_config(options.config_file)
    unique = list({h.name: h for h in hosts}.values())
    ensure_open_files(FILES_PER_HOST * len(unique))
    routes = {}
    for host in unique:
        target = resolve_target(host, options, ssh_config)
        routes[host.name] = (target, jump_targets(target, options, ssh_config))

    def connect(name: str, window: Window) -> T:
        target, jumps = routes[name]
        client = connect_target(target, options, jumps, window)
        try:
            return then(name, client)
        except BaseException:
            client.close()
            raise

    return fan_out(
        [h.name for h in unique],
        connect,
        close,
        limit=options.max_parallel,
        phase=phase,
        progress=progress,
        # Threads busy with `then` hold no handshake slot: twice as many keep the window full meanwhile.
        threads=2 * options.max_parallel,
    )


def fan_out(
    names: Sequence[str],
    work: Callable[[str, Window], T],
    close: Callable[[T], None],
    *,
    limit: int,
    phase: str,
    progress: ProgressFn | None = None,
    threads: int | None = None,
) -> dict[str, T]:
    """`work(name, window)` for every name, at most `limit` at once (`threads` workers, `limit` by default:
    more where `work` holds a window slot for only part of its time); all or nothing, results in `names`
    order.

    After the first failure no new host starts, in-flight retries give up, and every result already made is
    closed; the first failing host in `names` order is raised, with how many more failed.
    """
    window = Window(limit)
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for name in names:
        todo.put(name)
    outcomes: queue.SimpleQueue[tuple[str, T | None, BaseException | None]] = queue.SimpleQueue()
    started = time.monotonic()

    def worker() -> None:
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            try:
                if window.aborted.is_set():
                    raise Aborted
                outcomes.put((name, work(name, window), None))
            except Aborted:
                outcomes.put((name, None, None))  # another host failed first: never finished
            except BaseException as exc:
                window.abort()  # fail fast: hosts not started yet are skipped, retry loops give up
                outcomes.put((name, None, exc))

    # Daemon threads, so Ctrl-C need not wait for a handshake with a dead host to time out.
    for i in range(max(1, min(threads or limit, len(names)))):
        threading.Thread(target=worker, name=f"{phase}-{i}", daemon=True).start()
    results: dict[str, T] = {}
    errors: dict[str, BaseException] = {}
    try:
        if progress is not None:
            progress(Progress(phase, len(names)))
        for _ in names:
            name, result, exc = outcomes.get()
            if result is not None:
                results[name] = result
            elif exc is not None:
                errors[name] = exc
            if progress is not None:
                progress(Progress(phase, len(names), len(results), len(errors), name))
    except BaseException:
        window.abort()
        for result in results.values():
            close(result)
        raise
    if errors:
        for result in results.values():
            close(result)
        first = next(name for name in names if name in errors)
        exc = errors[first]
        if isinstance(exc, HostError) and len(errors) > 1:
            raise HostError(f"{exc} (and {len(errors) - 1} more host(s) failed)", host=exc.host) from exc
        raise exc
    log.debug("%s: %d host(s) in %.2fs", phase, len(results), time.monotonic() - started)
    return {name: results[name] for name in names}
