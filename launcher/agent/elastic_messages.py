"""Message bodies of the elastic frames (resets in place: NOTICE, RANK_READY, RANK_SYNCED, RESET, LEAVE).

Part of the launcher <-> agent protocol (`launcher.agent.protocol`, which says which kind carries which body),
apart so that a job that never sends these frames never builds their classes: the protocol loads this module
at the first such frame. Shipped with the agent: stdlib only, Python 3.7.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Notice:
    """To these ranks (their ids, the ranks they started as): `peer_lost`, or `hosts_updated` with Horovod's
    timestamp and update (removed 1, added 2)."""

    ranks: list[int]
    kind: str = "peer_lost"
    timestamp: float = 0.0
    update: int = 0


@dataclass(frozen=True)
class Ready:
    """A rank is at its reset point; `port`: a port free on its host now, for the new world's rendezvous."""

    port: int = 0


@dataclass(frozen=True)
class RankSynced:
    """A rank's new world ran its first collective, `seconds` after the rank stopped."""

    seconds: float = 0.0


@dataclass(frozen=True)
class ResetRequest:
    """Each rank's (by id, as a string: JSON keys) new identity, applied over its environment."""

    envs: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class LeaveRequest:
    """These ranks leave the job: each exits 0 at its reset point."""

    ranks: list[int] = field(default_factory=list)
