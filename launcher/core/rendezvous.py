"""Where the job meets (pure data); what each host reports is `launcher.agent.protocol.Facts`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet: MASTER_ADDR/PORT, plus each node's reachable address and TF_CONFIG ports.

    `node_addrs[i]` is the address other hosts reach node i by; `tf_ports[i]` holds one port per local rank.
    """

    master_addr: str
    master_port: int
    node_addrs: tuple[str, ...]
    tf_ports: tuple[tuple[int, ...], ...]
