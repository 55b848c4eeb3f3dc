"""Message bodies of the SAMPLES frames (the ranks' live CPU, memory and GPU; `distrun top`).

Part of the launcher <-> agent protocol (`launcher.agent.protocol`, which says which kind carries which body),
apart so that a job that never sends these frames never builds their classes: the protocol loads this module
at the first such frame. Shipped with the agent: stdlib only, Python 3.7.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankSample:
    """One running rank's process tree now: CPU percent since the last sample (100: one core), resident
    memory (summed over its processes), GPU utilisation and memory (None: no NVML, or on no GPU), seconds
    since it last wrote (None: never), whether its leader is stopped (SIGSTOP, Ctrl-Z), how many processes."""

    rank: int
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    gpu_util_percent: float | None = None
    gpu_memory_bytes: int | None = None
    last_output_age_s: float | None = None
    stopped: bool = False
    processes: int = 0
    # Its global set's latest collectives (launcher.agent.progress): sequence numbers of the last issued and
    # the last done, and the last issued one's name; None where the rank keeps no record. `moving`: they
    # changed while the rank was read (a busy job's ranks, read at moments apart, always differ a little).
    collective_issued: int | None = None
    collective_done: int | None = None
    collective_name: str | None = None
    collective_moving: bool = False


@dataclass(frozen=True)
class Samples:
    """Every running rank of the host, sampled at once (`interval`: the pace asked for)."""

    interval: float = 0.0
    ranks: list[RankSample] = field(default_factory=list)
    error: str = ""  # why sampling failed on the host this time (the ranks' last samples stand)
