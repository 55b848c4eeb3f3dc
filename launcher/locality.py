"""Is a host this machine? Then it runs through a local agent, without SSH."""

from __future__ import annotations

import ipaddress
import socket

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
