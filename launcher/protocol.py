"""The launcher <-> agent protocol: frames, message kinds and message bodies, in one place.

Both sides import this module. It is stdlib-only and runs on Python 3.7, because it is shipped to remote hosts
together with the agent (see `launcher.transport.bootstrap`).

The agent first writes MAGIC (a remote login shell may print anything before it), then only frames:
HEADER (kind, rank, payload length) followed by the payload. Message bodies are JSON objects built from the
dataclasses below; a reader ignores keys it does not know and fills fields it does not get with their
defaults, so a field can be added without breaking the other side. A change that cannot be read that way bumps
VERSION: the agent announces its version in HELLO and the launcher refuses a mismatch.

Lifecycle of one connection:
  agent: HELLO
  per attempt: launcher PROBE -> agent FACTS; launcher START -> agent OUT/ERR/EXIT ... DONE
  any time: launcher STOP / KILL / SIGNAL; both ways BEAT (when PROBE asked for heartbeats)
  launcher closes its end (EOF): the agent stops whatever still runs and exits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, TypeVar

VERSION = 2
MAGIC = b"\x00distrun-agent\x00"
HEADER = struct.Struct("!BiI")  # kind, rank (-1: the agent itself), payload length
READ_SIZE = 1 << 16

# launcher -> agent
PROBE, START, STOP, KILL, SIGNAL = 1, 2, 3, 4, 5
# agent -> launcher
HELLO, FACTS, OUT, ERR, EXIT, DONE = 9, 10, 11, 12, 13, 14
# --workdir: launcher SYNC -> agent WANT; then launcher BLOB (one per wanted object) or FETCH (get them from
# a peer host) -> agent SYNCED
SYNC, BLOB, FETCH = 6, 7, 8
WANT, SYNCED = 15, 16
# both ways: "still here", so a host that drops off the network is noticed without waiting for TCP to give up
BEAT = 20

# Annotations stay strings (`from __future__`), so the modern spellings below also run on Python 3.7.
M = TypeVar("M")


@dataclass(frozen=True)
class Hello:
    version: int
    pid: int = 0


@dataclass(frozen=True)
class ProbeRequest:
    """Preflight question, sent at the start of every attempt.

    `heartbeat`/`dead_after`: seconds between BEATs each way, and the silence after which the agent decides
    the launcher is gone (0: no heartbeats; a local agent's pipe closing says all).
    """

    ports: int
    cwd: str
    route_to: str | None = None
    python: str | None = None
    heartbeat: float = 0.0
    dead_after: float = 0.0
    # The script a `.py` command runs (relative to cwd): a missing one is exit 127 before anything starts.
    script: str | None = None
    # `distrun check`: also report versions, disk and clock (`check`), keep a TCP port open (`listen`), or
    # connect to one on another host (`connect_to`/`connect_port`).
    check: bool = False
    listen: bool = False
    connect_to: str | None = None
    connect_port: int = 0
    # Report `stack` (Python, torch, CUDA/NCCL as the ranks' interpreter `python` sees them).
    stack: bool = False


@dataclass(frozen=True)
class Facts:
    """One agent's preflight answer.

    `route_addr`/`route_ifname` are the local address and interface this host uses to reach the rendezvous
    address it was asked about (None when it was not asked or has no route). `devices` is what placing ranks
    on GPUs and cores needs, raw as read there (`launcher.devices.HostDevices.from_json` reads it): `gpus`
    (index in PCI order, uuid, numa_node), `visible_devices` (the host's CUDA_VISIBLE_DEVICES), `cores` (the
    agent's allowed cores) and `numa_cpulists` (node -> the kernel's cpulist).
    """

    hostname: str
    python: str
    cwd_exists: bool
    gpu_count: int
    free_ports: list[int]
    route_addr: str | None = None
    route_ifname: str | None = None
    python_found: bool = True
    devices: dict[str, Any] = field(default_factory=dict)
    script_found: bool = True
    # Only when the probe asked `check`: `time` is when the agent read the question (time.time()); `torch` is
    # {"version", "cuda", "gpus"} or {"error"} from the host's interpreter; `tcp_error` "" means connected.
    python_version: str = ""
    disk_free: int | None = None
    time: float = 0.0
    torch: dict[str, Any] | None = None
    listen_port: int = 0
    tcp_port: int = 0
    tcp_error: str | None = None
    # Only when the probe asked `stack`: {"python", "torch", "cuda", "nccl"} (a value "" when absent).
    stack: dict[str, str] | None = None


@dataclass(frozen=True)
class RankSpec:
    """One rank to start: `env` is applied over the host's environment, `defaults` only where it has none.

    `cpus`: the cores the agent pins the rank to before it runs (`--bind-cores`); None leaves it unpinned.
    """

    rank: int
    argv: list[str]
    env: dict[str, str]
    defaults: dict[str, str] = field(default_factory=dict)
    cpus: list[int] | None = None


@dataclass(frozen=True)
class StartRequest:
    """`env` is what every rank of the host starts from (the launcher's forwarded environment, --env-file,
    -x); before it, names in `unset` and names starting with `unset_prefixes` leave the host's environment
    (leftovers of another launcher)."""

    cwd: str
    grace: float
    ranks: list[RankSpec]
    env: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)
    unset_prefixes: list[str] = field(default_factory=list)
    # --workdir: the synced copy; ranks run in it and find it first on PYTHONPATH.
    workdir: str = ""


@dataclass(frozen=True)
class StopRequest:
    """Stop every rank: `first` (a signal name) at once; SIGTERM halfway through the grace period when `first`
    is gentler (SIGINT, so `except KeyboardInterrupt` clean-up runs); SIGKILL when the grace period ends.

    Signals travel by name: their numbers differ between systems. An empty STOP body means SIGTERM first.
    """

    first: str = "SIGTERM"


@dataclass(frozen=True)
class SignalRequest:
    """Send signal `name` to every running rank's process group; the job goes on.

    SIGSTOP (distrun was suspended: Ctrl-Z) also pauses the agent's watch for the launcher's heartbeats, which
    a stopped launcher cannot send, until SIGCONT.
    """

    name: str


@dataclass(frozen=True)
class RankExited:
    """`returncode`: as subprocess reports it, -N for a death by signal N.

    The rest is measured by the agent (os.wait4): the rank's pid, its wall time from start to exit,
    user+system CPU time and peak RSS (KiB) of the rank and the children it waited for; 0: not measured.
    """

    returncode: int
    pid: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0


@dataclass(frozen=True)
class SyncRequest:
    """--workdir: build the copy `manifest_hash` of `entries` (see launcher.store), keeping `keep` per
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


# A BLOB's payload: flags (1: zlib-compressed), the object's sha256 (raw), then the content.
BLOB_HEADER = struct.Struct("!B32s")
BLOB_ZLIB = 1


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def encode(kind: int, rank: int = -1, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, rank, len(payload)) + payload


def encode_message(kind: int, message: Any, rank: int = -1) -> bytes:
    return encode(kind, rank, json.dumps(dataclasses.asdict(message)).encode())


def _build(cls: type[M], data: dict[str, Any]) -> M:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in known})


def decode_message(cls: type[M], payload: bytes) -> M:
    """The message of type `cls` in `payload`; nested RankSpecs of a StartRequest are built too."""
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object for {cls.__name__}")
    if cls is StartRequest:
        data = dict(data, ranks=[_build(RankSpec, r) for r in data.get("ranks", [])])
    return _build(cls, data)


class FrameReader:
    """Splits a byte stream into (kind, rank, payload) frames.

    With `after_magic`, bytes before the agent's MAGIC are set aside in `preamble` instead of being parsed.
    """

    def __init__(self, after_magic: bool = False) -> None:
        self._buf = bytearray()
        self._waiting_for_magic = after_magic
        self.preamble = b""

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buf += data
        if self._waiting_for_magic:
            at = self._buf.find(MAGIC)
            if at < 0:
                return []
            self.preamble = bytes(self._buf[:at])
            del self._buf[: at + len(MAGIC)]
            self._waiting_for_magic = False
        frames = []
        pos = 0
        buf = self._buf
        size = HEADER.size
        while len(buf) - pos >= size:
            kind, rank, length = HEADER.unpack_from(buf, pos)
            end = pos + size + length
            if end > len(buf):
                break
            frames.append((kind, rank, bytes(buf[pos + size : end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames
