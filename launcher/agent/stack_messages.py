"""Message bodies of the stack frames (`distrun stacks`, --timeout, a stall: STACKS, STACK_DUMP).

Part of the launcher <-> agent protocol (`launcher.agent.protocol`, which says which kind carries which body),
apart so that a job that never sends these frames never builds their classes: the protocol loads this module
at the first such frame. Shipped with the agent: stdlib only, Python 3.7.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StacksRequest:
    """Read the stacks of every running rank (see `launcher.agent.stackdump`); the job goes on.

    `tool`: "auto" (py-spy where the host has it, else the standard library's hook), "py-spy" or "python";
    `wait`: seconds after which a rank not yet read is reported as such.
    """

    request_id: int
    tool: str = "auto"
    wait: float = 15.0


@dataclass(frozen=True)
class StackReply:
    """The answer to StacksRequest `request_id`: per rank {rank, pid, source, threads, error}; each thread
    {name, main, frames}, each frame [function, file, line, native], outermost first."""

    request_id: int
    ranks: list[dict[str, Any]] = field(default_factory=list)
