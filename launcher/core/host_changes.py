"""What a change of the discovery script's hosts does to a running elastic world (pure).

Horovod's driver polls the script while the job runs; when the set of hosts changes, every rank hears of it
(`hosts_updated`, with an update kind: removed 1, added 2, both 3), raises HostsUpdatedInterrupt at its next
commit, and the world is formed again: the ranks of removed hosts (and of slots a host no longer offers)
leave, the others stay in their old order, and newcomers fill the new slots up to --max-np.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.core.hosts import Host

REMOVED, ADDED = 1, 2  # Horovod's HostUpdateResult flags


@dataclass(frozen=True)
class HostsUpdate:
    """The script's hosts now (`hosts`) against those the world was formed with."""

    hosts: tuple[Host, ...]
    added: tuple[str, ...]  # new hosts, or hosts that offer more slots
    removed: tuple[str, ...]  # hosts gone, or offering fewer slots
    source: str = "--host-discovery-script"  # what changed them

    @property
    def kind(self) -> int:
        return (REMOVED if self.removed else 0) | (ADDED if self.added else 0)

    @property
    def cause(self) -> str:
        """The reset line's why: `hosts added: h2` (or removed, or both)."""
        parts = []
        if self.added:
            parts.append(f"added: {', '.join(self.added)}")
        if self.removed:
            parts.append(f"removed: {', '.join(self.removed)}")
        return "hosts " + "; ".join(parts) + f" ({self.source})"


def hosts_update(
    before: Sequence[Host], now: Sequence[Host], source: str = "--host-discovery-script"
) -> HostsUpdate | None:
    """None when the script lists the same hosts with the same slots (order does not matter)."""
    old = {host.name: host.slots for host in before}
    new = {host.name: host.slots for host in now}
    added = tuple(name for name, slots in new.items() if slots > old.get(name, 0))
    removed = tuple(name for name, slots in old.items() if slots > new.get(name, 0))
    if not added and not removed:
        return None
    return HostsUpdate(tuple(now), added, removed, source)


@dataclass(frozen=True)
class Regrouping:
    """The world after a hosts update: `staying` (rank ids, old rank order), `leaving`, and `newcomers`
    (the host of each new rank, in the order they take ranks)."""

    staying: tuple[int, ...]
    leaving: tuple[int, ...]
    newcomers: tuple[Host, ...]


def regroup(
    members: Sequence[tuple[int, str]],
    hosts: Sequence[Host],
    max_np: int,
    failed: Mapping[str, int] | None = None,
) -> Regrouping:
    """`members`: (rank id, host name) in rank order. A host keeps its lowest ranks up to its slots; the new
    slots are filled in the script's host order while the world is smaller than `max_np`, never the slot of
    a rank that failed (`failed`: how many on each host) in this attempt."""
    slots = {host.name: host.slots for host in hosts}
    used: dict[str, int] = {}
    staying: list[int] = []
    leaving: list[int] = []
    for rank_id, name in members:
        if used.get(name, 0) < slots.get(name, 0) and len(staying) < max_np:
            staying.append(rank_id)
            used[name] = used.get(name, 0) + 1
        else:
            leaving.append(rank_id)
    newcomers: list[Host] = []
    for host in hosts:
        free = host.slots - used.get(host.name, 0) - (failed or {}).get(host.name, 0)
        while free > 0 and len(staying) + len(newcomers) < max_np:
            newcomers.append(host)
            free -= 1
    return Regrouping(tuple(staying), tuple(leaving), tuple(newcomers))
