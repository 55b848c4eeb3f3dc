"""Where and how to reach a host over SSH, resolved as OpenSSH would: no I/O beyond reading ssh_config.

`resolve_target` follows OpenSSH's precedence: what the user wrote (`user@host`, the port and host key policy
options) beats ~/.ssh/config, which beats the defaults. ProxyJump hops are resolved through the same config
(`jump_targets`); a `Route` is a target with its hops. Not supported: Include (paramiko ignores it), and a
jump host's own ProxyJump: list every hop in the target's ProxyJump instead.
"""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import paramiko

from launcher.backends.ssh.options import HostKeyPolicy, SshOptions
from launcher.core.hosts import Host
from launcher.errors import UsageError

SSH_PORT = 22
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"

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
    key = tuple((file, file_signature(file)) for file in files)
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


def file_signature(path: Path) -> tuple[int, int, int]:
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


@dataclass(frozen=True)
class Route:
    """A resolved target and its ProxyJump hops, first hop first."""

    target: SshTarget
    jumps: tuple[SshTarget, ...] = ()


def routes(hosts: Sequence[Host], options: SshOptions) -> dict[str, Route]:
    """Every distinct host name's route, in the order given; UsageError for a bad ssh config."""
    ssh_config = load_ssh_config(options.config_file)
    found: dict[str, Route] = {}
    for host in {h.name: h for h in hosts}.values():
        target = resolve_target(host, options, ssh_config)
        found[host.name] = Route(target, tuple(jump_targets(target, options, ssh_config)))
    return found
