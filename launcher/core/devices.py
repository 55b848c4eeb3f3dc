"""Ranks to GPUs and cores (pure): `--gpus-per-rank`, `--bind-cores`, `--numa-binding`.

Each host's agent reports raw facts (its GPUs with UUIDs and NUMA nodes, its own CUDA_VISIBLE_DEVICES, the
cores it may use, each NUMA node's cores); this module reads them the way CUDA and torch do and gives every
rank its devices and cores. The agent applies the result: CUDA_VISIBLE_DEVICES in the rank's environment,
`os.sched_setaffinity` before exec.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.core.plan import Plan, Slot, plural
from launcher.errors import HostError, UsageError

_UUID_PREFIXES = ("GPU-", "MIG-")
# Programs whose ranks usually mean to train on GPUs: a Python program, or a launcher of one.
_GPU_JOB_PROGRAMS = re.compile(r"python[0-9.]*|torchrun|accelerate|deepspeed")
_LEADING_INT = re.compile(r"[+-]?[0-9]+")


class DeviceError(HostError):
    """A host cannot give its ranks the GPUs or cores asked for; the message names host, ranks and devices."""


@dataclass(frozen=True)
class Gpu:
    """One physical GPU of a host, in PCI bus order (nvidia-smi's index)."""

    index: int
    uuid: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class VisibleGpu:
    """A GPU a rank may be given: `id` is how CUDA_VISIBLE_DEVICES names it on that host."""

    id: str
    numa_node: int | None = None


@dataclass(frozen=True)
class HostDevices:
    """What one host reports for placement. `visible_devices` is its CUDA_VISIBLE_DEVICES (None: unset)."""

    gpus: tuple[Gpu, ...] = ()
    visible_devices: str | None = None
    cores: tuple[int, ...] = ()
    numa_cores: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostDevices:
        """From the agent's raw report: GPUs as dicts, cpulists as the kernel writes them ("0-3,8")."""
        gpus = tuple(
            Gpu(int(g["index"]), g.get("uuid"), _node(g.get("numa_node"))) for g in data.get("gpus", ())
        )
        numa = data.get("numa_cpulists") or {}
        return cls(
            gpus=gpus,
            visible_devices=data.get("visible_devices"),
            cores=tuple(sorted(int(c) for c in data.get("cores", ()))),
            numa_cores=tuple(sorted((int(node), parse_cpulist(text)) for node, text in numa.items())),
        )

    def visible(self) -> tuple[VisibleGpu, ...]:
        return visible_gpus(self.visible_devices, self.gpus)


@dataclass(frozen=True)
class RankDevices:
    """One rank's placement. None: left alone (no CUDA_VISIBLE_DEVICES set, no pinning)."""

    rank: int
    gpus: tuple[str, ...] | None = None
    cores: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Placement:
    """What the user asked for; `active` is False for today's default (place nothing)."""

    gpus_per_rank: int | None = None
    bind_cores: bool = False
    numa_binding: bool = False

    def __post_init__(self) -> None:
        if self.gpus_per_rank is not None and self.gpus_per_rank < 1:
            raise UsageError(f"--gpus-per-rank must be at least 1, got {self.gpus_per_rank}")
        if self.numa_binding and self.gpus_per_rank is None:
            raise UsageError("--numa-binding binds ranks to their GPUs' NUMA nodes: give --gpus-per-rank too")

    @property
    def active(self) -> bool:
        return self.gpus_per_rank is not None or self.binds

    @property
    def binds(self) -> bool:
        return self.bind_cores or self.numa_binding


def _node(value: Any) -> int | None:
    """A NUMA node as sysfs writes it; -1 (no affinity) and anything unreadable are unknown."""
    try:
        node = int(value)
    except (TypeError, ValueError):
        return None
    return node if node >= 0 else None


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The kernel's cpulist format, "0-3,8,10-11", as sorted core numbers."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(cores))


def format_cpulist(cores: Iterable[int]) -> str:
    """Cores as ranges, "0-3,8": short enough for one log line on a 128-core host."""
    ranges: list[list[int]] = []
    for core in sorted(cores):
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def visible_gpus(visible_devices: str | None, gpus: Sequence[Gpu]) -> tuple[VisibleGpu, ...]:
    """The GPUs a process on the host may use, read as CUDA (and torch's `_parse_visible_devices`) reads them.

    Unset: every GPU. Indices are read like strtoul and stop at the first that is negative, unreadable or
    out of range; a repeated entry hides every device. UUIDs (`GPU-...`, `MIG-...`, unique prefixes allowed)
    stop at the first entry of another kind, or that names no GPU the host reported.
    """
    if visible_devices is None:
        return tuple(VisibleGpu(str(g.index), g.numa_node) for g in gpus)
    entries = [entry.strip() for entry in visible_devices.split(",")]
    if entries[0].startswith(_UUID_PREFIXES):
        return _visible_by_uuid(entries, gpus)
    by_index = {g.index: g for g in gpus}
    chosen: list[VisibleGpu] = []
    for entry in entries:
        match = _LEADING_INT.match(entry)
        index = int(match.group()) if match else -1
        if index < 0 or index not in by_index:
            break
        if any(v.id == str(index) for v in chosen):
            return ()
        chosen.append(VisibleGpu(str(index), by_index[index].numa_node))
    return tuple(chosen)


def _visible_by_uuid(entries: Sequence[str], gpus: Sequence[Gpu]) -> tuple[VisibleGpu, ...]:
    prefix = entries[0][:4]
    known = [g for g in gpus if g.uuid]
    chosen: list[VisibleGpu] = []
    for entry in entries:
        if not entry.startswith(prefix):
            break
        if entry in (v.id for v in chosen):
            return ()
        matches = [g for g in known if g.uuid and g.uuid.startswith(entry)]
        if prefix == "GPU-" and known and len(matches) != 1:
            break  # CUDA stops at a UUID it cannot resolve to exactly one device
        # MIG instances are not listed per host, and without UUIDs from the driver nothing can be checked.
        chosen.append(VisibleGpu(entry, matches[0].numa_node if len(matches) == 1 else None))
    return tuple(chosen)


def _ranks_need(slots: Sequence[Slot], count: int, noun: str) -> str:
    """ "rank 3 needs 2 GPUs", "ranks 0-3 need 2 GPUs each (8)": a host's ranks are contiguous."""
    each = plural(count, noun, noun + "s")
    if len(slots) == 1:
        return f"rank {slots[0].rank} needs {each}"
    return f"ranks {slots[0].rank}-{slots[-1].rank} need {each} each ({count * len(slots)})"


def _shown(gpus: Sequence[VisibleGpu], visible_devices: str | None) -> str:
    listed = ",".join(g.id for g in gpus) or "none"
    where = "" if visible_devices is None else f" with CUDA_VISIBLE_DEVICES={visible_devices!r}"
    return f"{plural(len(gpus), 'GPU', 'GPUs')} ({listed}){where}"


def assign_gpus(
    host: str, slots: Sequence[Slot], devices: HostDevices, per_rank: int
) -> tuple[tuple[VisibleGpu, ...], ...]:
    """Each of the host's ranks gets the next `per_rank` visible GPUs, in order."""
    visible = devices.visible()
    needed = len(slots) * per_rank
    if needed > len(visible):
        raise DeviceError(
            f"host {host}: {_ranks_need(slots, per_rank, 'GPU')}, but it shows "
            f"{_shown(visible, devices.visible_devices)}",
            host=host,
        )
    return tuple(tuple(visible[i * per_rank : (i + 1) * per_rank]) for i in range(len(slots)))


def split_evenly(cores: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """Contiguous runs of `cores`, sizes differing by at most one (the first runs get the extra cores)."""
    size, extra = divmod(len(cores), parts)
    runs, start = [], 0
    for part in range(parts):
        end = start + size + (1 if part < extra else 0)
        runs.append(tuple(cores[start:end]))
        start = end
    return runs


def _numa_split(gpus: Sequence[Sequence[VisibleGpu]], devices: HostDevices) -> list[tuple[int, ...]] | None:
    """Each rank's share of its GPUs' NUMA nodes' cores, disjoint; None where a node is unknown."""
    node_cores = dict(devices.numa_cores)
    allowed = set(devices.cores)
    groups: dict[frozenset[int], list[int]] = {}
    for rank_index, rank_gpus in enumerate(gpus):
        nodes = frozenset(g.numa_node for g in rank_gpus if g.numa_node is not None)
        if len(nodes) < len({g.numa_node for g in rank_gpus}) or not nodes <= node_cores.keys():
            return None
        groups.setdefault(nodes, []).append(rank_index)
    shares: list[tuple[int, ...]] = [()] * len(gpus)
    taken: set[int] = set()
    for nodes, members in groups.items():
        pool = sorted({c for n in nodes for c in node_cores[n]} & allowed - taken)
        if len(pool) < len(members):
            return None
        for member, share in zip(members, split_evenly(pool, len(members)), strict=True):
            shares[member] = share
        taken.update(pool)
    return shares


def assign_cores(
    host: str,
    slots: Sequence[Slot],
    devices: HostDevices,
    gpus: Sequence[Sequence[VisibleGpu]] | None,
    numa_binding: bool,
) -> tuple[list[tuple[int, ...]], str | None]:
    """Disjoint, non-empty core sets for the host's ranks, and a note when NUMA binding fell back.

    With `numa_binding`, ranks get the allowed cores of their GPUs' NUMA nodes, shared evenly among the
    ranks on the same nodes; where a node is unknown (sysfs says -1, or no driver info) every rank gets an
    even share of the host's allowed cores instead, as without it.
    """
    if len(devices.cores) < len(slots):
        raise DeviceError(
            f"host {host}: {_ranks_need(slots, 1, 'core')}, but only "
            f"{plural(len(devices.cores), 'core is', 'cores are')} allowed there "
            f"({format_cpulist(devices.cores) or 'none'})",
            host=host,
        )
    note = None
    if numa_binding and gpus is not None:
        shares = _numa_split(gpus, devices)
        if shares is not None:
            return shares, None
        note = f"host {host}: a GPU's NUMA node is unknown there, so its cores are split evenly instead"
    return split_evenly(devices.cores, len(slots)), note


def place_ranks(
    plan: Plan, hosts: Sequence[HostDevices], placement: Placement
) -> tuple[tuple[RankDevices, ...], tuple[str, ...]]:
    """Every rank's devices and cores in rank order, and notes worth a warning; DeviceError names the host."""
    placed: list[RankDevices] = []
    notes: list[str] = []
    for node, devices in enumerate(hosts):
        slots = plan.node_slots(node)
        name = plan.nodes[node].name
        gpus = None
        if placement.gpus_per_rank is not None:
            gpus = assign_gpus(name, slots, devices, placement.gpus_per_rank)
        cores: Sequence[tuple[int, ...] | None] = [None] * len(slots)
        if placement.binds:
            cores, note = assign_cores(name, slots, devices, gpus, placement.numa_binding)
            notes.extend([note] if note else [])
        for i, slot in enumerate(slots):
            ids = None if gpus is None else tuple(g.id for g in gpus[i])
            placed.append(RankDevices(slot.rank, ids, cores[i]))
    return tuple(placed), tuple(notes)


def assumed_hosts(plan: Plan, placement: Placement) -> tuple[HostDevices, ...]:
    """What `--dry-run` assumes without probing: just enough GPUs per host, numbered 0.., all visible."""
    per_rank = placement.gpus_per_rank or 0
    return tuple(
        HostDevices(gpus=tuple(Gpu(i) for i in range(plan.local_size(node) * per_rank)))
        for node in range(plan.node_count)
    )


def describe(plan: Plan, ranks: Sequence[RankDevices]) -> list[str]:
    """One line per host: which rank gets which GPUs and cores (for `-v` and `--dry-run`)."""
    lines = []
    for node, host in enumerate(plan.nodes):
        parts = []
        for slot in plan.node_slots(node):
            placed = ranks[slot.rank]
            what = []
            if placed.gpus is not None:
                what.append(f"{'GPU' if len(placed.gpus) == 1 else 'GPUs'} {','.join(placed.gpus)}")
            if placed.cores is not None:
                what.append(f"cores {format_cpulist(placed.cores)}")
            parts.append(f"rank {slot.rank}: {' '.join(what)}")
        lines.append(f"host {host.name}: " + "; ".join(parts))
    return lines


def looks_like_gpu_job(command: Sequence[str]) -> bool:
    """A Python program (or a launcher of one): the kind of command whose ranks usually want GPUs."""
    first = os.path.basename(command[0]) if command else ""
    return first.endswith(".py") or bool(_GPU_JOB_PROGRAMS.fullmatch(first))


def shared_gpu_warnings(plan: Plan, gpu_counts: Sequence[int], command: Sequence[str]) -> list[str]:
    """One line per host whose ranks outnumber its GPUs, when the job looks like GPU training.

    Not an error: the same command may be a CPU job. collectives.init() falls back to gloo there.
    """
    if not looks_like_gpu_job(command):
        return []
    warnings = []
    for node, count in enumerate(gpu_counts):
        ranks = plan.local_size(node)
        if 0 < count < ranks:
            warnings.append(
                f"host {plan.nodes[node].name}: {plural(ranks, 'rank', 'ranks')} share "
                f"{plural(count, 'GPU', 'GPUs')}, so they cannot each have their own (collectives falls back "
                f"to gloo there); for a GPU job start at most {count} there, or use --gpus-per-rank on hosts "
                "with enough"
            )
    return warnings
