"""`distrun ssh-setup`: make key login work on every host, as ssh-copy-id does for one, idempotently.

Per host: try key login the way a launch connects (ssh config, known_hosts, keys); where the host refuses
the key, log in once with the password, append the public key to `~/.ssh/authorized_keys` (700/600, no
duplicate), then verify key login. The password is asked once for all hosts and kept only in memory.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from launcher.backends.ssh.config import Route, routes
from launcher.backends.ssh.connect import AuthRefused, connect_target
from launcher.backends.ssh.options import SshOptions
from launcher.core.hosts import Host
from launcher.errors import HostError, UsageError

log = logging.getLogger(__name__)

DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
MAX_PARALLEL = 32

# Run by the host's login shell; the key arrives on stdin, so no user data is ever part of the command.
# `grep -F` on the key's base64 blob makes a second run add nothing, whatever the comment says.
INSTALL_KEY = (
    "sh -c '"
    'umask 077; d="$HOME/.ssh"; f="$d/authorized_keys"; '
    'mkdir -p "$d" && chmod 700 "$d" && touch "$f" && chmod 600 "$f" && read -r key && set -- $key && '
    'if grep -qF "$2" "$f"; then echo present; else '
    '{ if [ -s "$f" ] && [ -n "$(tail -c1 "$f")" ]; then echo; fi; printf "%s\\n" "$key"; } >> "$f" '
    "&& echo added; fi'"
)

State = Literal["ready", "installed", "failed"]


@dataclass(frozen=True)
class HostSetup:
    """What ssh-setup did on one host: `detail` is the one line shown for it."""

    host: str
    state: State
    detail: str


@dataclass(frozen=True)
class Key:
    """The key `ssh-setup` installs: its file, its public line, and whether it was made just now."""

    path: Path
    public: str  # `ssh-ed25519 AAAA... comment`
    created: bool


def ensure_key(identity_files: Sequence[Path]) -> Key:
    """The key to install: `-i`, else the first of ~/.ssh/id_{ed25519,ecdsa,rsa}, else a new ed25519 key."""
    candidates = [p.expanduser() for p in identity_files] or [Path(p).expanduser() for p in DEFAULT_KEYS]
    for path in candidates:
        if path.is_file():
            return Key(path, _public_line(path), created=False)
    if identity_files:
        raise UsageError(f"identity file {identity_files[0]} does not exist")
    return _create_ed25519(candidates[0])


def _public_line(path: Path) -> str:
    pub = path.with_name(path.name + ".pub")
    if pub.is_file():
        return pub.read_text().strip()
    import paramiko

    try:
        key = paramiko.PKey.from_path(str(path))
    except (paramiko.SSHException, OSError, ValueError) as err:
        raise UsageError(f"cannot read the key {path}: {err}") from None
    return f"{key.get_name()} {key.get_base64()}"


def _create_ed25519(path: Path) -> Key:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    line = f"{public.decode()} {getpass.getuser()}@{socket.gethostname()}"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # O_EXCL: never overwrite a key that appeared meanwhile; 0600 from the first byte.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    path.with_name(path.name + ".pub").write_text(line + "\n")
    return Key(path, line, created=True)


def _key_login(route: Route, options: SshOptions) -> None:
    connect_target(route.target, options, route.jumps).close()


def _install(route: Route, options: SshOptions, password: str, public: str) -> str:
    """Append the key over a password login; returns `added` or `present`."""
    client = connect_target(route.target, options, route.jumps, password=password)
    try:
        stdin, stdout, stderr = client.exec_command(INSTALL_KEY, timeout=options.connect_timeout * 3)
        stdin.write(public + "\n")
        stdin.channel.shutdown_write()
        answer = stdout.read().decode(errors="replace").strip()
        status = stdout.channel.recv_exit_status()
        if status != 0:
            why = stderr.read().decode(errors="replace").strip().splitlines()
            raise HostError(
                f"{route.target.host}: installing the key failed ({why[-1] if why else f'exit {status}'})"
            )
        return answer
    finally:
        client.close()


def setup_hosts(
    hosts: Sequence[Host],
    options: SshOptions,
    key: Key,
    ask_password: Callable[[Sequence[str]], str],
) -> list[HostSetup]:
    """Make key login work on every host; `ask_password(users@hosts)` is called at most once."""
    # No policy of its own: --host-key-policy, else ~/.ssh/config's StrictHostKeyChecking, else accept-new,
    # as a launch resolves it (resolve_target). A `yes` there is the user's word that no key is learnt.
    options = replace(options, identity_files=(key.path, *options.identity_files))
    found = routes(hosts, options)
    workers = max(1, min(MAX_PARALLEL, len(hosts)))

    def first_try(host: Host) -> HostSetup | None:
        try:
            _key_login(found[host.name], options)
        except AuthRefused:
            return None
        except HostError as err:
            return HostSetup(host.name, "failed", str(err))
        return HostSetup(host.name, "ready", f"{host.name}: key login works already")

    with ThreadPoolExecutor(workers) as pool:
        results = dict(zip([h.name for h in hosts], pool.map(first_try, hosts), strict=True))
    pending = [h for h in hosts if results[h.name] is None]
    if pending:
        password = ask_password([f"{found[h.name].target.user}@{h.name}" for h in pending])

        def install(host: Host) -> HostSetup:
            route = found[host.name]
            try:
                answer = _install(route, options, password, key.public)
            except HostError as err:
                return HostSetup(host.name, "failed", str(err))
            done = "key installed" if answer == "added" else "key was already in authorized_keys"
            try:
                _key_login(route, options)
            except HostError as err:
                # sshd ignores keys in a group- or world-writable home or ~/.ssh (StrictModes).
                hint = "check its AuthorizedKeysFile and that your home is not group- or world-writable"
                return HostSetup(host.name, "failed", f"{err} ({done}, yet sshd does not take it: {hint})")
            return HostSetup(host.name, "installed", f"{host.name}: {done}; key login works")

        with ThreadPoolExecutor(workers) as pool:
            results.update(zip([h.name for h in pending], pool.map(install, pending), strict=True))
    return [r for r in results.values() if r is not None]


def ask_password(from_stdin: bool, targets: Sequence[str]) -> str:
    """The password, once: from standard input's first line, or typed on the terminal without echo."""
    if from_stdin:
        line = sys.stdin.readline()
        if not line:
            raise UsageError("--password-stdin: standard input is empty")
        return line.rstrip("\r\n")
    try:
        with open("/dev/tty"):
            pass
    except OSError:
        raise UsageError("no terminal to ask for the password on; pipe it with --password-stdin") from None
    shown = ", ".join(targets[:3]) + (f" and {len(targets) - 3} more" if len(targets) > 3 else "")
    return getpass.getpass(f"password for {shown}: ")
