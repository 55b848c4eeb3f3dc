"""Host keys: which key a host should present (known_hosts), what to do with one no file lists, and the reason
shown when a key changed.

Keys are filed under the name OpenSSH uses: HostKeyAlias, else the HostName we connect to, as `[name]:port`
when the port is not 22 (hashed entries work). Policies:
  strict      unknown and changed keys are refused (StrictHostKeyChecking yes/ask)
  accept-new  unknown keys are appended to the user's known_hosts, changed keys refused (the default)
  ignore      any key is accepted and nothing is written (StrictHostKeyChecking no/off)
Host certificates are not supported.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import threading
from collections.abc import Sequence
from pathlib import Path

import paramiko

from launcher.backends.ssh.config import USER_KNOWN_HOSTS, SshTarget, file_signature

log = logging.getLogger(__name__)


class UnknownHostKey(Exception):
    """The host presented a key no known_hosts file lists, and the policy is strict; the message says how to
    add it."""


class KnownHosts:
    """Each known_hosts file parsed once, not once per connection: the only reader of these files.

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

    def files_with(self, files: Sequence[Path], name: str) -> list[Path]:
        """Those of `files` that list a key for `name`."""
        with self.lock:
            return [path for path in files if self._load(path).lookup(name) is not None]

    def added(self, path: Path, name: str, key: paramiko.PKey) -> None:
        """`path` got a line for `name` from us (call with `lock` held)."""
        self._load(path).add(name, key.get_name(), key)
        self._files[path] = (file_signature(path), self._files[path][1])

    def _load(self, path: Path) -> paramiko.HostKeys:
        signature = file_signature(path)
        cached = self._files.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        keys = paramiko.HostKeys()
        with contextlib.suppress(OSError):
            keys.load(str(path))
        self._files[path] = (signature, keys)
        return keys


KNOWN_HOSTS = KnownHosts()


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def _files_with_key(target: SshTarget) -> list[Path]:
    files = (*target.known_hosts_files, *target.global_known_hosts_files)
    return KNOWN_HOSTS.files_with(files, target.known_hosts_name)


def has_known_key(target: SshTarget) -> bool:
    """Whether a known_hosts file already lists the host (`distrun check` reports new keys as recorded)."""
    return bool(_files_with_key(target))


def trust_known_keys(client: paramiko.SSHClient, target: SshTarget) -> None:
    """Give `client` the target's keys from known_hosts (paramiko checks them, and never writes them back)."""
    name = target.known_hosts_name
    files = (*target.global_known_hosts_files, *target.known_hosts_files)
    for key_type, key in KNOWN_HOSTS.keys_for(files, name).items():
        client.get_host_keys().add(name, key_type, key)


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Decides about keys in no known_hosts file; for changed keys paramiko raises BadHostKeyException."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        target = self.target
        if target.host_key_policy == "ignore":
            log.debug("%s: accepting host key %s unchecked", target.host, fingerprint(key))
            return
        if target.host_key_policy == "strict":
            where = target.known_hosts_files[0] if target.known_hosts_files else Path(USER_KNOWN_HOSTS[0])
            raise UnknownHostKey(
                f"host key for {hostname} ({fingerprint(key)}) is not in {where} and host key checking is "
                f"strict; after checking the fingerprint add it"
                f" (`ssh-keyscan -p {target.port} {target.hostname} >> {where}`) or use the accept-new policy"
            )
        _append_known_host(target, hostname, key)


def _append_known_host(target: SshTarget, name: str, key: paramiko.PKey) -> None:
    if not target.known_hosts_files:
        return
    path = target.known_hosts_files[0]
    entry = paramiko.HostKeys.hash_host(name) if target.hash_known_hosts else name
    with KNOWN_HOSTS.lock:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
        KNOWN_HOSTS.added(path, name, key)
    log.warning("Permanently added %s (%s) to %s", name, fingerprint(key), path)


def changed_key_reason(target: SshTarget, exc: paramiko.BadHostKeyException) -> str:
    """Why a host whose key changed is refused, and the command that removes the old key where it is filed."""
    name = target.known_hosts_name
    files = _files_with_key(target) or list(target.known_hosts_files[:1])
    fix = " or ".join(f"`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(p))}`" for p in files)
    return (
        f"host key for {name} has CHANGED (now {fingerprint(exc.key)},"
        f" known {fingerprint(exc.expected_key)}); this may be an attack, or the host was reinstalled:"
        f" if expected, remove the old key with {fix}"
    )
