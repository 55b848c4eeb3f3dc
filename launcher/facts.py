"""What each host's agent reports in its first answer, and where the job meets (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostFacts:
    """One agent's preflight answer.

    `route_addr`/`route_ifname` are the local address and interface this host uses to reach the rendezvous
    address it was asked about (None when it was not asked or has no route).
    """

    hostname: str
    python: str
    cwd_exists: bool
    gpu_count: int
    free_ports: tuple[int, ...]
    route_addr: str | None = None
    route_ifname: str | None = None
    python_found: bool = True

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostFacts:
        return cls(
            hostname=str(data["hostname"]),
            python=str(data["python"]),
            cwd_exists=bool(data["cwd_exists"]),
            gpu_count=int(data["gpu_count"]),
            free_ports=tuple(int(p) for p in data["free_ports"]),
            route_addr=data.get("route_addr"),
            route_ifname=data.get("route_ifname"),
            python_found=bool(data.get("python_found", True)),
        )


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet: MASTER_ADDR/PORT, plus each node's reachable address and TF_CONFIG ports.

    `node_addrs[i]` is the address other hosts reach node i by; `tf_ports[i]` holds one port per local rank.
    """

    master_addr: str
    master_port: int
    node_addrs: tuple[str, ...]
    tf_ports: tuple[tuple[int, ...], ...]
