"""An elastic reset's new world (pure): who gets which rank, and each rank's new identity.

Ranks keep the id they started with (the rank in the agent's frames and the console's prefixes) through
resets; only their place in the world changes. Survivors keep the low ranks in their old order, so the new
rank 0 is the oldest survivor and holds up-to-date state; newcomers come last. Hosts take node ranks in the
order their first rank appears.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.core.env import horovod_env, rank_env
from launcher.core.hosts import Host
from launcher.core.plan import Plan, Slot
from launcher.core.rendezvous import Rendezvous


@dataclass(frozen=True)
class Member:
    """A rank of the world: its id (the rank it started as) and its host."""

    rank_id: int
    host: Host


@dataclass(frozen=True)
class NewWorld:
    """`members[i]` holds rank i of `plan`."""

    plan: Plan
    members: tuple[Member, ...]

    def rank_of(self, rank_id: int) -> int:
        return next(i for i, member in enumerate(self.members) if member.rank_id == rank_id)

    @property
    def rank0_host(self) -> Host:
        return self.members[0].host


def new_world(survivors: Sequence[Member], newcomers: Sequence[Member] = ()) -> NewWorld:
    """`survivors` in their old rank order, then `newcomers`."""
    members = (*survivors, *newcomers)
    nodes: list[Host] = []
    per_node: dict[str, int] = {}
    slots = []
    for rank, member in enumerate(members):
        if member.host.name not in per_node:
            per_node[member.host.name] = 0
            nodes.append(member.host)
        node_rank = next(i for i, host in enumerate(nodes) if host.name == member.host.name)
        slots.append(Slot(rank, per_node[member.host.name], node_rank, member.host))
        per_node[member.host.name] += 1
    return NewWorld(Plan(tuple(slots), tuple(nodes)), members)


def reset_envs(
    world: NewWorld,
    *,
    master_addr: str,
    master_port: int,
    run_id: str,
    resets: int,
    max_restarts: int,
) -> dict[int, dict[str, str]]:
    """Each member's new identity by rank id: torchrun's contract and horovodrun's variables of its new place,
    the rendezvous on the new rank 0's host. TF_CONFIG is left as it was: a TensorFlow worker list has no
    elastic reset."""
    rdzv = Rendezvous(master_addr, master_port, (), ())
    envs = {}
    for slot, member in zip(world.plan.slots, world.members, strict=True):
        contract, _ = rank_env(
            slot, world.plan, rdzv, run_id=run_id, ifname=None, workers=(), restart_count=resets,
            max_restarts=max_restarts,
        )  # fmt: skip
        contract.pop("TF_CONFIG", None)
        contract.update(horovod_env(slot, world.plan))
        envs[member.rank_id] = contract
    return envs


def ids_by_rank(members: Mapping[int, int]) -> list[int]:
    """Rank ids ordered by their current rank (`members`: rank id -> current rank)."""
    return sorted(members, key=lambda rank_id: members[rank_id])
