"""A host's facts: what the agent answers a PROBE with (`Facts`), read from this host as it is.

Its name and machine identity, free ports, the route and interface toward rank 0's host, GPUs, cores and
NUMA nodes, and for `distrun check` its Python, torch, disk, clock and a TCP connection to rank 0's host.
Shipped with the agent as source (`launcher.backends.bootstrap`): stdlib only, Python 3.7.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
import time
from typing import Any

from launcher.agent.protocol import Facts, ProbeRequest
from launcher.agent.software import TORCH_PROBE, ask, software_of, which
from launcher.agent.store import has_copy

# Linux's ioctl for an interface's IPv4 address: the stdlib has no call that names it.
SIOCGIFADDR = 0x8915


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all are bound, so the ports are distinct.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A port free on this host now (an elastic reset's new rendezvous)."""
    return _free_ports(1)[0]


def _ipv4_ifname(addr: str) -> str | None:
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == addr:
            return name
    return None


def _ipv6_ifname(addr: str) -> str | None:
    packed = socket.inet_pton(socket.AF_INET6, addr).hex()
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[0] == packed:
                    return fields[5]
    except OSError:
        pass
    return None


def _route(target: str) -> tuple[str | None, str | None]:
    """The local address and interface this host uses to reach `target` (a UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None, None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                local = str(s.getsockname()[0])
        except OSError:
            continue
        ifname = _ipv6_ifname(local) if family == socket.AF_INET6 else _ipv4_ifname(local)
        return local, ifname
    return None, None


_NVIDIA_GPUS = "proc/driver/nvidia/gpus"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _nvidia_gpus(root: str) -> list[dict[str, Any]]:
    """The host's NVIDIA GPUs in PCI bus order (nvidia-smi's numbering), with UUIDs and NUMA nodes.

    Best-effort: the driver's /proc entries name each GPU's bus id, sysfs gives that device's NUMA node;
    without them (some containers) only /dev/nvidiaN tells how many there are.
    """
    try:
        bus_ids = sorted(os.listdir(os.path.join(root, _NVIDIA_GPUS)), key=str.lower)
    except OSError:
        try:
            count = sum(
                1 for n in os.listdir(os.path.join(root, "dev")) if n.startswith("nvidia") and n[6:].isdigit()
            )
        except OSError:
            count = 0
        return [{"index": i} for i in range(count)]
    gpus = []
    for index, bus_id in enumerate(bus_ids):
        info = _read(os.path.join(root, _NVIDIA_GPUS, bus_id, "information")) or ""
        uuid = next(
            (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("GPU UUID")), None
        )
        node = _read(os.path.join(root, "sys/bus/pci/devices", bus_id.lower(), "numa_node"))
        gpus.append({"index": index, "uuid": uuid, "numa_node": node.strip() if node else None})
    return gpus


def _numa_cpulists(root: str) -> dict[str, str]:
    base = os.path.join(root, "sys/devices/system/node")
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    lists = {}
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            text = _read(os.path.join(base, name, "cpulist"))
            if text is not None:
                lists[name[4:]] = text.strip()
    return lists


def _allowed_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def device_facts(root: str = "/") -> dict[str, Any]:
    """What launcher.core.devices needs to give ranks GPUs and cores, as raw as it is read here."""
    return {
        "gpus": _nvidia_gpus(root),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cores": _allowed_cores(),
        "numa_cpulists": _numa_cpulists(root),
    }


TCP_PROBE_TIMEOUT = 5.0


def _disk_free(path: str) -> Any:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _tcp_error(host: str, port: int) -> str:
    """ "" when a TCP connection to host:port opens (the listener need not accept it), else why not."""
    try:
        with socket.create_connection((host, port), timeout=TCP_PROBE_TIMEOUT):
            return ""
    except socket.timeout:  # noqa: UP041 - not yet TimeoutError on the Python 3.7 a host may have
        return f"no answer within {TCP_PROBE_TIMEOUT:.0f}s (a firewall dropping packets?)"
    except OSError as exc:
        return exc.strerror or str(exc)


def machine_identity() -> str:
    """What tells this machine from others: its machine-id and boot, and (for containers and network
    namespaces sharing one kernel) its network namespace and hostname; "" where none of the files exists."""
    parts = [
        (_read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or "").strip(),
        (_read("/proc/sys/kernel/random/boot_id") or "").strip(),
    ]
    if not any(parts):
        return ""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return "/".join([*parts, netns, socket.gethostname()])


def host_facts(request: ProbeRequest, listener: Any = None) -> Facts:
    received = time.time()
    route_addr, route_ifname = _route(request.route_to) if request.route_to else (None, None)
    devices = device_facts()
    cwd = request.cwd or "."
    script = request.script
    extra: dict[str, Any] = {}
    if listener is not None:
        extra["listen_port"] = listener.getsockname()[1]
    if request.software:
        extra["software"] = software_of(request.python or sys.executable)
    if request.workdir_hash:
        extra["workdir_cached"] = has_copy(request.workdir_hash)
    if request.check:
        extra.update(
            python_version=".".join(str(part) for part in sys.version_info[:3]),
            disk_free=_disk_free(cwd),
            time=received,
            torch=ask(request.python or sys.executable, TORCH_PROBE),
        )
    if request.connect_to and request.connect_port:
        extra["tcp_port"] = request.connect_port
        extra["tcp_error"] = _tcp_error(request.connect_to, request.connect_port)
    return Facts(
        hostname=socket.gethostname(),
        machine=machine_identity(),
        python=sys.executable,
        python_found=which(request.python) is not None if request.python else True,
        script_found=not script or os.path.isfile(os.path.join(cwd, script)),
        cwd_exists=os.path.isdir(cwd),
        gpu_count=len(devices["gpus"]),
        free_ports=_free_ports(request.ports),
        route_addr=route_addr,
        route_ifname=route_ifname,
        devices=devices,
        **extra,
    )
