"""Is a host this machine? Then it runs through a local agent, without SSH."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Sequence

from launcher.core.hosts import Host
from launcher.errors import HostSpecError

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_obviously_local(name: str) -> bool:
    """Local by name alone: no lookups, so a localhost-only launch never touches the resolver."""
    if name in _LOOPBACK_NAMES or name == socket.gethostname():
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_local_host(hostname: str, mine: frozenset[str] | None = None) -> bool:
    """`hostname` is what SSH would connect to (ssh config's HostName already applied); `mine`: this
    machine's addresses, when the caller asks about many hosts (see `local_addresses`)."""
    if is_obviously_local(hostname):
        return True
    try:
        addrs = {str(ipaddress.ip_address(hostname))}
    except ValueError:
        try:
            addrs = {str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(hostname, None)}
        except OSError:
            return False  # this machine cannot resolve it; SSH will say so if it cannot either
    if any(ipaddress.ip_address(a).is_loopback for a in addrs):
        return True
    return bool(addrs & (local_addresses() if mine is None else mine))


def local_addresses() -> frozenset[str]:
    import psutil  # only needed for names that are not obviously local

    return frozenset(a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs)


def current_user() -> str:
    """The login name of this process's user (not $USER, which the environment can say anything about)."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def runs_here(host: Host, user: str | None = None) -> bool:
    """The host is this machine by name and would run as this user: no SSH.

    `nobody@localhost` is this machine under another user: only SSH can run it as that user.
    """
    return is_obviously_local(host.name) and host.user in (None, user or current_user())


def refuse_this_machine_twice(hosts: Sequence[Host], local: Sequence[bool]) -> None:
    """Two entries that are both this machine would be two nodes sharing its ports, GPUs and LOCAL_RANKs."""
    first: Host | None = None
    for host, is_local in zip(hosts, local, strict=True):
        if not is_local:
            continue
        if first is not None:
            raise HostSpecError(
                f"{first.origin or first.name} and {host.origin or host.name} are both this machine; "
                f"list it once with all its slots (e.g. {first.name}:{first.slots + host.slots})"
            )
        first = host


def refuse_one_machine_twice(hosts: Sequence[Host], identities: Sequence[str]) -> None:
    """The same refusal for any machine, by what its agent reported (`Facts.machine`): a name and an address
    of one host (`-H h1:1,10.0.0.1:1`) would also share its GPUs and LOCAL_RANKs. An empty identity (an agent
    that could not tell) is never a duplicate."""
    seen: dict[str, Host] = {}
    for host, identity in zip(hosts, identities, strict=True):
        if not identity:
            continue
        first = seen.setdefault(identity, host)
        if first is not host:
            raise HostSpecError(
                f"{first.origin or first.name} and {host.origin or host.name} are the same machine (their "
                f"agents report one machine-id, boot and hostname); list it once with all its slots "
                f"(e.g. {first.name}:{first.slots + host.slots})"
            )
