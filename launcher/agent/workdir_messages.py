"""Message bodies of the --workdir frames (SYNC, WANT, FETCH, SYNCED).

Part of the launcher <-> agent protocol (`launcher.agent.protocol`, which says which kind carries which body),
apart so that a job that never sends these frames never builds their classes: the protocol loads this module
at the first such frame. Shipped with the agent: stdlib only, Python 3.7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SyncRequest:
    """--workdir: build the copy `manifest_hash` of `entries` (see launcher.agent.store), keeping `keep` per
    `project` when pruning. The agent answers WANT with what it lacks, then SYNCED."""

    project: str
    entries: list[list[Any]]
    manifest_hash: str
    keep: int = 3
    # Non-empty: serve the copy's objects to peer hosts that present this token, from now until START (each
    # object once this host has it: a host feeds the next while it is still being fed).
    serve_token: str = ""


@dataclass(frozen=True)
class Want:
    """What the host lacks, and where it serves peers (0: it does not). Again after a FETCH that failed
    (`error`): what it still lacks."""

    digests: list[str]
    error: str = ""
    serve_port: int = 0


@dataclass(frozen=True)
class FetchRequest:
    """Get `digests` from the peer host serving at addr:port (see SyncRequest.serve_token)."""

    addr: str
    port: int
    token: str
    digests: list[str]


@dataclass(frozen=True)
class Synced:
    """The copy is ready at `path` (or `error` says why not); `manifest_hash` is what the host computed.

    `received`: bytes that came from the launcher, `from_peers`: from peers."""

    path: str = ""
    manifest_hash: str = ""
    received: int = 0
    error: str = ""
    from_peers: int = 0
