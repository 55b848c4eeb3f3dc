"""Where the job meets (pure data); what each host reports is `launcher.agent.protocol.Facts`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.agent.protocol import Facts


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet: MASTER_ADDR/PORT, plus each node's reachable address and TF_CONFIG ports.

    `node_addrs[i]` is the address other hosts reach node i by; `tf_ports[i]` holds one port per local rank.
    """

    master_addr: str
    master_port: int
    node_addrs: tuple[str, ...]
    tf_ports: tuple[tuple[int, ...], ...]


def choose_rendezvous(
    master_addr: str,
    *,
    given_port: int | None,
    last_port: int | None,
    names: Sequence[str],
    all_local: bool,
    facts: Sequence[Facts],
    slots: Sequence[int],
) -> Rendezvous:
    """The attempt's rendezvous from what each host (node-rank order) reported: its address as the others
    reach it, rank 0's port (--master-port, else a probed one other than the last attempt's `last_port`: a
    port in TIME_WAIT would fail the new group), and one free port per local rank for TF_CONFIG."""
    node_addrs = tuple(
        master_addr if i == 0 or all_local else (f.route_addr or name)
        for i, (name, f) in enumerate(zip(names, facts, strict=True))
    )
    # Rank 0's host probed two rendezvous candidates first (see `launcher.runtime.probe.probe_requests`),
    # then its ranks' ports.
    candidates, rank0_ports = facts[0].free_ports[:2], facts[0].free_ports[2:]
    master_port = given_port or next(p for p in candidates if p != last_port)
    tf_ports = tuple(
        tuple(rank0_ports if i == 0 else f.free_ports)[:n]
        for i, (f, n) in enumerate(zip(facts, slots, strict=True))
    )
    return Rendezvous(master_addr, master_port, node_addrs, tf_ports)
