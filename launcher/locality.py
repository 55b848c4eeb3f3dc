"""Is a host name this machine? Then it runs through a local agent, without SSH."""

from __future__ import annotations

import ipaddress
import socket

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_local_host(name: str) -> bool:
    if name in _LOOPBACK_NAMES or name == socket.gethostname():
        return True
    try:
        return ipaddress.ip_address(name).is_loopback or name in _local_addresses()
    except ValueError:
        pass  # a name, not an address
    try:
        addrs = {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False  # this machine cannot resolve it; only SSH (and ~/.ssh/config) may know it
    if any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        return True
    return bool(addrs & _local_addresses())


def _local_addresses() -> set[str]:
    import psutil  # only needed for names that are not obviously local

    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
