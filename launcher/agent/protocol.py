"""The launcher <-> agent protocol: frames, message kinds and message bodies, in one place.

Both sides import this module. It is stdlib-only and runs on Python 3.7, because it is shipped to remote hosts
together with the agent (see `launcher.backends.bootstrap`).

The agent first writes MAGIC (a remote login shell may print anything before it), then HELLO, then only
frames: HEADER (kind, agent id, rank, payload length) followed by the payload. HELLO alone is framed with
HELLO_HEADER, the layout of protocol version 2, in every version: any agent's HELLO can be read, so one that
speaks another version is refused with one line instead of being misparsed.

The agent id names the agent a frame is from or for, so one link can carry several agents (a relay). The
launcher gives each agent its id in the frames it sends; the agent stamps its own frames with the id of the
last frame it read (HELLO, sent before any, carries none).

Message bodies are JSON objects built from the dataclasses below, and from those of the `*_messages` modules
beside this one for the frames a plain job may never see (`MESSAGES` says which kind carries which); a reader
ignores keys it does not know and fills fields it does not get with their defaults, so a field can be added
without breaking the other side. A change that cannot be read that way bumps VERSION. Each side
handles frames through a kind -> handler table (`dispatch`), so a new request is one message type here, one
kind number, and one handler on the side that answers it.

Near 400 lines because the wire is one thing to read and to ship: every kind, the common message bodies and
the framing stay together here, where both sides and the version number see them. How a START's variables land
in a rank's environment is `launcher.agent.environment`.

Lifecycle of one connection:
  agent: HELLO
  per attempt: launcher PROBE -> agent FACTS; launcher START -> agent OUT/ERR/EXIT ... DONE
  any time: launcher STOP / KILL / SIGNAL; launcher STACKS -> agent STACK_DUMP;
  while ranks run, every StartRequest.sample_interval: agent SAMPLES;
  both ways BEAT (when PROBE asked for heartbeats)
  launcher closes its end (EOF): the agent stops whatever still runs and exits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, NamedTuple, TypeVar  # noqa: UP035 - Python 3.7 runs this

if TYPE_CHECKING:  # at run time these come from `__getattr__` below, at their first use
    from launcher.agent.elastic_messages import LeaveRequest as LeaveRequest  # noqa: PLC0414 - re-exported
    from launcher.agent.elastic_messages import Notice as Notice  # noqa: PLC0414 - re-exported
    from launcher.agent.elastic_messages import RankSynced as RankSynced  # noqa: PLC0414 - re-exported
    from launcher.agent.elastic_messages import Ready as Ready  # noqa: PLC0414 - re-exported
    from launcher.agent.elastic_messages import ResetRequest as ResetRequest  # noqa: PLC0414 - re-exported
    from launcher.agent.sample_messages import RankSample as RankSample  # noqa: PLC0414 - re-exported
    from launcher.agent.sample_messages import Samples as Samples  # noqa: PLC0414 - re-exported
    from launcher.agent.stack_messages import StackReply as StackReply  # noqa: PLC0414 - re-exported
    from launcher.agent.stack_messages import StacksRequest as StacksRequest  # noqa: PLC0414 - re-exported
    from launcher.agent.workdir_messages import FetchRequest as FetchRequest  # noqa: PLC0414 - re-exported
    from launcher.agent.workdir_messages import Synced as Synced  # noqa: PLC0414 - re-exported
    from launcher.agent.workdir_messages import SyncRequest as SyncRequest  # noqa: PLC0414 - re-exported
    from launcher.agent.workdir_messages import Want as Want  # noqa: PLC0414 - re-exported

VERSION = 5  # 5: the elastic frames (resets in place); 4: SAMPLES, the ranks' live CPU, memory and GPU
MAGIC = b"\x00distrun-agent\x00"
HEADER = struct.Struct("!BIiI")  # kind, agent id, rank (-1: the agent itself), payload length
HELLO_HEADER = struct.Struct("!BiI")  # kind, rank, payload length: HELLO's framing, the same in every version
READ_SIZE = 1 << 16
# When the launcher is gone nobody waits on the agent: a slow rank must not hold the host for a full grace
# period. Links wait this long (plus their own slack) for an agent to end after EOF.
ORPHAN_GRACE_CAP = 2.0

# launcher -> agent
PROBE, START, STOP, KILL, SIGNAL = 1, 2, 3, 4, 5
# agent -> launcher
HELLO, FACTS, OUT, ERR, EXIT, DONE = 9, 10, 11, 12, 13, 14
# --workdir: launcher SYNC -> agent WANT; then launcher BLOB (one per wanted object) or FETCH (get them from
# a peer host) -> agent SYNCED
SYNC, BLOB, FETCH = 6, 7, 8
WANT, SYNCED = 15, 16
# every running rank's stacks (distrun stacks, --timeout, a stall): launcher STACKS -> agent STACK_DUMP
STACKS, STACK_DUMP = 17, 18
# while ranks run, every StartRequest.sample_interval seconds: agent SAMPLES (launcher.agent.sampling)
SAMPLES = 19
# both ways: "still here", so a host that drops off the network is noticed without waiting for TCP to give up
BEAT = 20
# Elastic resets in place (launcher.agent.elastic; only for a StartRequest with `elastic`). Agent -> launcher:
# a rank opted in (OPTED_IN), is at its last commit (RANK_READY, with a free port of the host), formed the new
# world (RANK_SYNCED, with the seconds since it stopped). Launcher -> agent: tell these ranks a peer is gone
# or hosts changed (NOTICE), reset these ranks with these environments (RESET), start these new ranks beside
# the running ones (ADD), these ranks leave (LEAVE).
OPTED_IN, RANK_READY, RANK_SYNCED = 21, 22, 23
NOTICE, RESET, ADD, LEAVE = 24, 25, 26, 27

# Annotations stay strings (`from __future__`), so the modern spellings below also run on Python 3.7.
M = TypeVar("M")


@dataclass(frozen=True)
class Hello:
    """The agent's first frame: the protocol version it speaks, and its pid."""

    version: int
    pid: int = 0


@dataclass(frozen=True)
class ProbeRequest:
    """Preflight question, sent at the start of every attempt.

    `heartbeat`/`dead_after`: seconds between BEATs each way, and the silence after which the agent decides
    the launcher is gone (0: no heartbeats; a local agent's pipe closing says all). `wait_while_stopped`: the
    launcher is a terminal's job, which its user may stop (Ctrl-Z, kill -STOP) for as long as they like: its
    silence alone ends nothing while its machine still answers on the connection (launcher.agent.transport).
    """

    ports: int
    cwd: str
    route_to: str | None = None
    python: str | None = None
    heartbeat: float = 0.0
    dead_after: float = 0.0
    wait_while_stopped: bool = False
    # The script a `.py` command runs (relative to cwd): a missing one is exit 127 before anything starts.
    script: str | None = None
    # `distrun check`: also report versions, disk and clock (`check`), keep a TCP port open (`listen`), or
    # connect to one on another host (`connect_to`/`connect_port`, with or without `check`).
    check: bool = False
    listen: bool = False
    connect_to: str | None = None
    connect_port: int = 0
    # Report `software` (Python, torch, CUDA/NCCL as the ranks' interpreter `python` sees them).
    software: bool = False
    # `distrun check --workdir`: say whether this host's cache holds the copy of that manifest hash.
    workdir_hash: str = ""


@dataclass(frozen=True)
class Facts:
    """One agent's preflight answer.

    `route_addr`/`route_ifname` are the local address and interface this host uses to reach the rendezvous
    address it was asked about (None when it was not asked or has no route). `devices` is what placing ranks
    on GPUs and cores needs, raw as read there (`launcher.core.devices.HostDevices.from_json` reads it):
    `gpus`
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
    # Which machine this is, as far as the agent can tell (machine-id, boot id, network namespace, hostname;
    # "" where none is readable): two hosts that report the same are one machine under two names.
    machine: str = ""
    # Only when the probe asked `check`: `time` is when the agent read the question (time.time()); `torch` is
    # {"version", "cuda", "gpus"} or {"error"} from the host's interpreter; `tcp_error` "" means connected.
    python_version: str = ""
    disk_free: int | None = None
    time: float = 0.0
    torch: dict[str, Any] | None = None
    listen_port: int = 0
    tcp_port: int = 0
    tcp_error: str | None = None
    # Only when the probe asked `software`: {"python", "torch", "cuda", "nccl"} (a value "" when absent).
    software: dict[str, str] | None = None
    workdir_cached: bool | None = None  # None: not asked


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
    # --sample-interval: seconds between SAMPLES frames while ranks run (0: none).
    sample_interval: float = 0.0
    # Every rank gets an elastic socket (DISTRUN_ELASTIC_SOCKET), so that it may opt in to resets in place.
    elastic: bool = False


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
    `stopped`: the agent had signalled the rank to stop (STOP, KILL, its own stop) while it still ran; a rank
    that exited on its own before that is not one distrun stopped, whatever its code. None: not said (a
    stand-in agent's), and then a rank still running by the launcher's count when the stop began counts.
    """

    returncode: int
    pid: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    stopped: bool | None = None


# A BLOB's payload: flags (1: zlib-compressed), the object's sha256 (raw), then the content.
BLOB_HEADER = struct.Struct("!B32s")
BLOB_ZLIB = 1


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data` to `fd`: frames on either side, and distrun's console and log files. (Here because
    this module travels with the agent.)"""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            # Someone sharing the file description made it non-blocking: wait instead of spinning.
            select.select([], [fd], [])


def encode(kind: int, rank: int = -1, payload: bytes = b"", agent: int = 0) -> bytes:
    return HEADER.pack(kind, agent, rank, len(payload)) + payload


def encode_message(kind: int, message: Any, rank: int = -1, agent: int = 0) -> bytes:
    return encode(kind, rank, json.dumps(dataclasses.asdict(message)).encode(), agent)


def encode_hello(hello: Hello) -> bytes:
    payload = json.dumps(dataclasses.asdict(hello)).encode()
    return MAGIC + HELLO_HEADER.pack(HELLO, -1, len(payload)) + payload


def _build(cls: type[M], data: dict[str, Any]) -> M:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in known})


def decode_message(cls: type[M], payload: bytes) -> M:
    """The message of type `cls` in `payload`; nested RankSpecs of a StartRequest (RankSamples of Samples)
    are built too."""
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object for {cls.__name__}")
    nested = _NESTED.get(cls.__name__)
    if nested is not None:
        data = dict(data, ranks=[_build(_message_class(nested), r) for r in data.get("ranks", [])])
    return _build(cls, data)


class Frame(NamedTuple):
    kind: int
    agent: int
    rank: int
    payload: bytes


# Each kind's message type, by name; kinds not listed carry raw bytes (OUT, ERR) or nothing (KILL, DONE,
# BEAT).
MESSAGES: dict[int, str] = {
    PROBE: "ProbeRequest",
    START: "StartRequest",
    STOP: "StopRequest",
    SIGNAL: "SignalRequest",
    HELLO: "Hello",
    FACTS: "Facts",
    EXIT: "RankExited",
    STACKS: "StacksRequest",
    STACK_DUMP: "StackReply",
    SAMPLES: "Samples",
    SYNC: "SyncRequest",
    FETCH: "FetchRequest",
    WANT: "Want",
    SYNCED: "Synced",
    NOTICE: "Notice",
    RANK_READY: "Ready",
    RANK_SYNCED: "RankSynced",
    RESET: "ResetRequest",
    ADD: "StartRequest",
    LEAVE: "LeaveRequest",
}
# The message types whose `ranks` are a list of another message type.
_NESTED = {"StartRequest": "RankSpec", "Samples": "RankSample"}
# The bodies of the frames a plain job may never see live in modules of their own, loaded at first use (here
# or by whoever imports them): a job that never resets, syncs a workdir or reads stacks does not build their
# classes, about a third of distrun's start-up imports of this module. Names here stay importable from this
# module (`__getattr__`); the agent's own modules import them from where they live, so that the bootstrap
# runs those modules first (launcher.backends.bootstrap.shipped_modules).
ELSEWHERE = {
    "Notice": "elastic_messages",
    "Ready": "elastic_messages",
    "RankSynced": "elastic_messages",
    "ResetRequest": "elastic_messages",
    "LeaveRequest": "elastic_messages",
    "StacksRequest": "stack_messages",
    "StackReply": "stack_messages",
    "RankSample": "sample_messages",
    "Samples": "sample_messages",
    "SyncRequest": "workdir_messages",
    "Want": "workdir_messages",
    "FetchRequest": "workdir_messages",
    "Synced": "workdir_messages",
}
# A side's handlers: kind -> a function of the side's context (the node a frame came from, say), the frame and
# its message (see `decode_frame`).
Handlers = Dict[int, Callable[..., None]]  # noqa: UP006 - evaluated at run time, on Python 3.7 too


def __getattr__(name: str) -> Any:
    """A message type of ELSEWHERE, from its module (imported now if it was not)."""
    module = ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = getattr(__import__(f"launcher.agent.{module}", fromlist=[name]), name)
    globals()[name] = found
    return found


def _message_class(name: str) -> type:
    known = globals().get(name)
    return known if isinstance(known, type) else __getattr__(name)


def message_type(kind: int) -> type | None:
    """The message type frames of `kind` carry (None: raw bytes or nothing)."""
    name = MESSAGES.get(kind)
    return None if name is None else _message_class(name)


def decode_frame(frame: Frame) -> Any:
    """The frame's message: its kind's type from MESSAGES (an empty body: that type's defaults), else the raw
    payload."""
    cls = message_type(frame.kind)
    if cls is None:
        return frame.payload
    return decode_message(cls, frame.payload) if frame.payload else cls()


def dispatch(handlers: Handlers, frame: Frame, *context: Any) -> bool:
    """Call its kind's handler as `handler(*context, frame, message)`; False for a kind this side does not
    handle: it is ignored, so a newer peer's new request does not break an older one."""
    handler = handlers.get(frame.kind)
    if handler is None:
        return False
    handler(*context, frame, decode_frame(frame))
    return True


class FrameReader:
    """Splits a byte stream into frames.

    With `after_magic` (the launcher's side), bytes before the agent's MAGIC are set aside in `preamble`, and
    the HELLO after it, framed with HELLO_HEADER, comes out as the first frame (agent id 0).
    """

    def __init__(self, after_magic: bool = False) -> None:
        self._buf = bytearray()
        self._waiting_for_magic = after_magic
        self._waiting_for_hello = after_magic
        self.preamble = b""

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        if self._waiting_for_magic:
            at = self._buf.find(MAGIC)
            if at < 0:
                return []
            self.preamble = bytes(self._buf[:at])
            del self._buf[: at + len(MAGIC)]
            self._waiting_for_magic = False
        if self._waiting_for_hello:
            if len(self._buf) < HELLO_HEADER.size:
                return []
            kind, rank, length = HELLO_HEADER.unpack_from(self._buf)
            if len(self._buf) < HELLO_HEADER.size + length:
                return []
            end = HELLO_HEADER.size + length
            frames.append(Frame(kind, 0, rank, bytes(self._buf[HELLO_HEADER.size : end])))
            del self._buf[:end]
            self._waiting_for_hello = False
        pos = 0
        buf = self._buf
        size = HEADER.size
        while len(buf) - pos >= size:
            kind, agent, rank, length = HEADER.unpack_from(buf, pos)
            end = pos + size + length
            if end > len(buf):
                break
            frames.append(Frame(kind, agent, rank, bytes(buf[pos + size : end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames
