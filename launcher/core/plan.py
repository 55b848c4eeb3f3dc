"""Assign ranks to hosts (pure)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from launcher.core.hosts import Host
from launcher.errors import PlanError

# Each rank costs its host's agent two pipes, and the usual open-file limit is 1024; no training host has more
# cores than this either, so a bigger count is a typo (`-np 99999999999`), not a plan.
MAX_RANKS_PER_HOST = 1024
# Without -H, ranks per CPU core on this machine before --oversubscribe is needed: enough for the usual
# "-np 4 on a laptop" (ranks that wait on each other), far below a fork bomb.
LOCAL_RANKS_PER_CORE = 4


@dataclass(frozen=True)
class Slot:
    """One rank's place: global rank, index on its host, and the host's node index."""

    rank: int
    local_rank: int
    node_rank: int
    host: Host


@dataclass(frozen=True)
class Plan:
    """`nodes` are the hosts that got at least one rank, in node-rank order; `slots` are in rank order."""

    slots: tuple[Slot, ...]
    nodes: tuple[Host, ...]

    @property
    def world_size(self) -> int:
        return len(self.slots)

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def _by_node(self) -> tuple[tuple[Slot, ...], ...]:
        # Grouped once: building every rank's env asks for these per rank, which must not be quadratic.
        groups: list[list[Slot]] = [[] for _ in self.nodes]
        for slot in self.slots:
            groups[slot.node_rank].append(slot)
        return tuple(tuple(group) for group in groups)

    def node_slots(self, node_rank: int) -> tuple[Slot, ...]:
        return self._by_node[node_rank]

    def local_size(self, node_rank: int) -> int:
        return len(self._by_node[node_rank])

    @functools.cached_property
    def _hosts_at_local_rank(self) -> tuple[tuple[int, ...], ...]:
        # For each local rank, the node ranks that hold one, in node order (Horovod's cross communicator).
        deepest = max((len(group) for group in self._by_node), default=0)
        return tuple(
            tuple(node for node, group in enumerate(self._by_node) if len(group) > local)
            for local in range(deepest)
        )

    def horovod_cross(self, slot: Slot) -> tuple[int, int]:
        """(cross rank, cross size) as Horovod counts them: among the hosts that have a rank at this slot's
        local rank (horovodrun's `get_host_assignments`), not among all hosts: with `-H a:2,b:1` rank 1 is
        alone at local rank 1, so its cross size is 1."""
        nodes = self._hosts_at_local_rank[slot.local_rank]
        return nodes.index(slot.node_rank), len(nodes)


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan is made from, taken from the configuration as one value (`LaunchConfig.plan_inputs`):
    the launch, a restart, an elastic shrink, --dry-run and `distrun check` all plan from it, so that none
    of them can leave a setting out (a restart once dropped --oversubscribe that way)."""

    hosts: tuple[Host, ...]
    num_proc: int | None
    oversubscribe: bool = False

    def resized(self, hosts: Sequence[Host], num_proc: int) -> PlanInputs:
        """The same inputs on other hosts and another world size (what a restart decided)."""
        return replace(self, hosts=tuple(hosts), num_proc=num_proc)


def plural(count: int, noun: str, nouns: str) -> str:
    """`1 slot`, `12 slots`: messages read as sentences."""
    return f"{count} {noun if count == 1 else nouns}"


def implicit_localhost(num_proc: int | None, cpus: int, oversubscribe: bool) -> Host:
    """The host used without -H/--hostfile: this machine, with `-np` slots within a bound of its cores."""
    count = num_proc or 1
    limit = max(1, cpus) * LOCAL_RANKS_PER_CORE
    if count > limit and not oversubscribe:
        raise PlanError(
            f"-np {count}: this machine has {plural(cpus, 'CPU core', 'CPU cores')} and distrun starts"
            f" at most {limit} ranks here ({LOCAL_RANKS_PER_CORE} per core); use --oversubscribe for more"
        )
    return Host("localhost", slots=count, origin="localhost (no -H)")


def _ranks_per_host(hosts: Sequence[Host], num_proc: int, oversubscribe: bool) -> list[int]:
    """Fill each host's slots in order; beyond the slots, spread the rest round-robin up to max_slots.

    `oversubscribe` lifts max_slots (as mpirun's --oversubscribe): the rest is spread evenly over every host.
    """
    if num_proc > MAX_RANKS_PER_HOST * len(hosts):
        raise PlanError(
            f"requested {plural(num_proc, 'process', 'processes')} on {plural(len(hosts), 'host', 'hosts')}: "
            f"distrun starts at most {MAX_RANKS_PER_HOST} per host"
        )
    counts = []
    left = num_proc
    for host in hosts:
        counts.append(min(host.slots, left))
        left -= counts[-1]
    if left == 0:
        return counts
    if oversubscribe:
        # Round-robin keeps the oversubscription even, so no single host is slowed much more than the others.
        each, extra = divmod(left, len(hosts))
        return [count + each + (index < extra) for index, count in enumerate(counts)]
    slots = sum(host.slots for host in hosts)
    capacity = sum(host.capacity for host in hosts)
    if num_proc > capacity:
        message = (
            f"requested {plural(num_proc, 'process', 'processes')} "
            f"but the hosts provide {plural(slots, 'slot', 'slots')}"
        )
        if capacity > slots:
            message += f" ({capacity} with max_slots)"
        raise PlanError(message + "; add --oversubscribe to place more ranks than slots")
    while left:
        for index, host in enumerate(hosts):
            if left and counts[index] < host.capacity:
                counts[index] += 1
                left -= 1
    return counts


def make_plan(hosts: Sequence[Host], num_proc: int | None, oversubscribe: bool = False) -> Plan:
    """Give ranks to hosts in the order given, contiguous per host; `num_proc` None means every slot."""
    if not hosts:
        raise PlanError("no hosts to run on")
    if num_proc is None:
        num_proc = sum(host.slots for host in hosts)
    if num_proc <= 0:
        raise PlanError(f"the number of processes must be positive, got {num_proc}")
    counts = _ranks_per_host(hosts, num_proc, oversubscribe)
    for host, count in zip(hosts, counts, strict=True):
        if count > MAX_RANKS_PER_HOST:
            raise PlanError(
                f"{host.origin or host.name}: {count} ranks on one host;"
                f" distrun starts at most {MAX_RANKS_PER_HOST}"
            )
    slots: list[Slot] = []
    nodes: list[Host] = []
    for host, count in zip(hosts, counts, strict=True):
        if count == 0:
            continue
        first_rank, node_rank = len(slots), len(nodes)
        slots.extend(Slot(first_rank + local, local, node_rank, host) for local in range(count))
        nodes.append(host)
    return Plan(slots=tuple(slots), nodes=tuple(nodes))


def build_plan(inputs: PlanInputs) -> Plan:
    """The one way a launch's plan is made from its configuration (see `PlanInputs`)."""
    return make_plan(inputs.hosts, inputs.num_proc, inputs.oversubscribe)
