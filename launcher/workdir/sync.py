"""`--workdir`: bring the copy to every host's cache, each host sent only what it lacks.

Every agent gets the manifest (SYNC) and answers with the content hashes it lacks (WANT). A host is then fed
either by the launcher over its agent link (BLOBs, each compressed once, zlib where that saves a tenth or
more, and the same bytes for every host), or, with relaying on, by a peer host (FETCH: the host gets the
objects from the peer over TCP, each as soon as the peer has it; see launcher.agent.receive). `Chain` decides
who
feeds whom: hosts form a chain fed by the launcher at its head, so the launcher's uplink carries one copy,
not one per host, and all hosts receive at once. A fetch that fails falls back to the launcher. The agent
answers SYNCED once its copy is complete.

Senders run one thread per host; the main thread reads answers on the job's loop (launcher.runtime.loop),
which handles --timeout, signals, lost hosts and `distrun stacks` as in every other phase.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.agent.protocol import (
    BLOB,
    BLOB_HEADER,
    BLOB_ZLIB,
    FETCH,
    SYNC,
    SYNCED,
    WANT,
    FetchRequest,
    Frame,
    Synced,
    SyncRequest,
    Want,
)
from launcher.core.progress import Progress, ProgressFn, StallDeadline
from launcher.errors import HostError
from launcher.runtime.loop import Loop, Phase
from launcher.runtime.node import Node
from launcher.workdir.files import Workdir, WorkdirChanged, WorkdirFile

log = logging.getLogger(__name__)

# Compressed content is sent only when it is this much smaller (code compresses well; weights do not).
WORTH_COMPRESSING = 0.9
SAMPLE = 1 << 16
SAMPLE_MIN = 256  # below this, a frame header costs more than compression could save


@dataclass(frozen=True)
class HostCopy:
    """Where one host's copy is, the manifest hash it computed, and what it took to get it there: objects
    it received, bytes the launcher sent it, bytes it got from `fed_by` (a peer host)."""

    path: str
    manifest_hash: str
    files_sent: int
    bytes_sent: int
    bytes_from_peers: int = 0
    fed_by: str | None = None


@dataclass
class Chain:
    """Who feeds whom (pure). With relaying, hosts form a chain in the order they ask: each is fed by the last
    host before it that serves peers (the launcher feeds the first, unless a host has the whole copy already),
    while that host is itself still being fed; so the launcher sends one copy, and every host receives while
    the next one does. Without relaying, and for a host that a failed fetch left short, the launcher feeds it.
    """

    relay: bool
    last: str | None = None
    fed_by: dict[str, str | None] = field(default_factory=dict)

    def has_copy(self, host: str) -> None:
        """`host` has the whole copy and serves it: the chain starts there, unless it has started."""
        if self.relay and self.last is None and not self.fed_by:
            self.last = host

    def want(self, host: str, serves: bool) -> str | None:
        """`host` lacks objects: who feeds it (None: the launcher)."""
        feeder = self.last if self.relay else None
        self.fed_by[host] = feeder
        if self.relay and serves:
            self.last = host
        return feeder

    def fallback(self, host: str) -> None:
        """A fetch from a peer failed: the launcher feeds `host` what it still lacks."""
        self.fed_by[host] = None


def _compressible(data: bytes) -> bool:
    """Whether compressing `data` may pay, judged from its first SAMPLE bytes (weights, archives and random
    data do not compress, and trying costs as much as sending them)."""
    sample = data[:SAMPLE]
    return len(data) > SAMPLE_MIN and len(zlib.compress(sample, 1)) < WORTH_COMPRESSING * len(sample)


def project_key(root: str) -> str:
    """Which copies are versions of one project, for pruning: this machine and the directory."""
    return f"{socket.gethostname()}:{root}"


class Blobs:
    """Each object's BLOB body, read, checked and compressed once however many hosts want it."""

    def __init__(self, workdir: Workdir) -> None:
        self._files = workdir.by_digest()
        self._root = workdir.root
        self._bodies: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def body(self, digest: str) -> bytes:
        with self._lock:
            ready = self._bodies.get(digest)
        if ready is not None:
            return ready
        made = self._make(self._files[digest])
        with self._lock:
            return self._bodies.setdefault(digest, made)

    def _make(self, entry: WorkdirFile) -> bytes:
        try:
            data = (self._root / entry.path).read_bytes()
        except OSError as err:
            raise WorkdirChanged(entry.path, f"could not be read any more ({err.strerror})") from None
        if hashlib.sha256(data).hexdigest() != entry.digest:
            raise WorkdirChanged(entry.path, "changed")
        flags = 0
        if _compressible(data):
            packed = zlib.compress(data, 1)
            if len(packed) < WORTH_COMPRESSING * len(data):
                flags, data = BLOB_ZLIB, packed
        return BLOB_HEADER.pack(flags, bytes.fromhex(entry.digest)) + data


def _lost(node: Node, what: str) -> HostError:
    """The host is given up: its link is torn down now, so that no sender stays blocked on it."""
    node.drop()
    return HostError(f"host {node.name}: {what}", host=node.name)


class _Sender(threading.Thread):
    """Sends one host the objects it asked for; a send error is kept for the main thread to report. `cancel`
    stops it between objects (the sync was given up)."""

    def __init__(self, node: Node, digests: Sequence[str], blobs: Blobs) -> None:
        super().__init__(name=f"workdir-{node.name}", daemon=True)
        self.node, self.digests, self.blobs = node, digests, blobs
        self.sent = 0
        self.error: BaseException | None = None
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> None:
        try:
            for digest in self.digests:
                if self._cancelled.is_set():
                    return
                body = self.blobs.body(digest)
                self.node.send(BLOB, body)
                self.sent += len(body)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc


class Syncing(Phase[Node]):
    """The sync, a phase of the job's loop: WANT and SYNCED answers by the handler table; senders' errors,
    their progress and the stall deadline checked on each tick. `dead_after`: the heartbeat liveness of
    every phase."""

    def __init__(
        self,
        nodes: Sequence[Node],
        workdir: Workdir,
        *,
        stall: float,
        dead_after: float,
        relay: bool,
        token: str,
        progress: ProgressFn | None,
    ) -> None:
        super().__init__([(node, node) for node in nodes], dead_after if dead_after > 0 else float("inf"))
        self.nodes = list(nodes)
        self.by_name = {node.name: node for node in nodes}
        self.stall = stall
        self.token = token
        self.progress = progress
        self.blobs = Blobs(workdir)
        self.senders: dict[str, _Sender] = {}
        self.wanted: dict[str, list[str]] = {}
        self.ports: dict[str, int] = {}
        # Relaying needs hosts others can reach: remote ones the launcher reached directly (not by a proxy).
        servers = [n for n in nodes if not n.local and n.link.peer_addr]
        self.chain = Chain(relay and len(servers) > 1)
        self.copies: dict[str, HostCopy] = {}
        self.deadline = StallDeadline(stall, time.monotonic())
        self.moved = 0
        self.handlers = {WANT: self._on_want, SYNCED: self._on_synced}

    @property
    def done(self) -> bool:
        return len(self.copies) == len(self.nodes)

    def listening(self, context: Node) -> bool:
        return context.name not in self.copies

    def doing(self, now: float) -> str:
        return f"syncing its workdir ({len(self.copies)} of {len(self.nodes)} hosts done)"

    def next_due(self) -> float | None:
        return self.deadline.at

    def cancel(self) -> None:
        for sender in self.senders.values():
            sender.cancel()

    # -- events

    def on_tick(self, now: float) -> None:
        for sender in self.senders.values():
            if sender.error is not None:
                if isinstance(sender.error, HostError):
                    raise sender.error
                raise _lost(sender.node, f"sending the workdir failed: {sender.error}")
        if (total := sum(s.sent for s in self.senders.values())) != self.moved:
            self.moved = total
            self.deadline.progressed(now)  # bytes still going out: not a stall
        self.check_liveness(now)
        if self.deadline.remaining(now) <= 0:
            name = next(n.name for n in self.nodes if n.name not in self.copies)
            raise HostError(
                f"host {name}: no answer while syncing the workdir for {self.stall:g}s", host=name
            )

    def on_silent(self, context: Node, seconds: float, now: float) -> None:
        raise _lost(context, f"silent for {self.dead_after:g}s while syncing the workdir")

    def on_closed(self, context: Node, now: float) -> None:
        detail = context.diagnostics()
        raise _lost(context, "the link closed while syncing the workdir" + (f": {detail}" if detail else ""))

    def on_stall(self, seconds: float, now: float) -> None:
        self.deadline.progressed(now)  # time spent stopped is no host's fault

    def _feed(self, name: str, feeder: str | None) -> None:
        node = self.by_name[name]
        if feeder is None:
            self.senders[name] = _Sender(node, self.wanted[name], self.blobs)
            self.senders[name].start()
            return
        peer = self.by_name[feeder]
        addr = peer.link.peer_addr
        assert addr is not None, "only hosts with an address serve"
        node.send(FETCH, FetchRequest(addr, self.ports[feeder], self.token, self.wanted[name]))

    def _on_want(self, node: Node, now: float, frame: Frame, want: Want) -> None:
        self.deadline.progressed(now)
        self.wanted[node.name] = want.digests
        serves = bool(want.serve_port and node.link.peer_addr) and not node.local
        if serves:
            self.ports[node.name] = want.serve_port
        if want.error:  # a peer failed it
            log.info("host %s: fetching the workdir failed (%s); sending it", node.name, want.error)
            self.chain.fallback(node.name)
            self._feed(node.name, None)
        elif not want.digests:
            if serves:
                self.chain.has_copy(node.name)
        elif node.local:
            self._feed(node.name, None)  # a pipe on this machine: no uplink to spare
        else:
            self._feed(node.name, self.chain.want(node.name, serves))

    def _on_synced(self, node: Node, now: float, frame: Frame, synced: Synced) -> None:
        self.deadline.progressed(now)
        if synced.error:
            raise HostError(f"host {node.name}: {synced.error}", host=node.name)
        fed = self.senders.get(node.name)
        if fed is not None:
            fed.join()
        self.copies[node.name] = HostCopy(
            synced.path,
            synced.manifest_hash,
            len(self.wanted.get(node.name, ())),
            fed.sent if fed else 0,
            synced.from_peers,
            self.chain.fed_by.get(node.name),
        )
        if self.progress is not None:
            self.progress(Progress("syncing the workdir", len(self.nodes), len(self.copies)))


def sync(
    nodes: Sequence[Node],
    workdir: Workdir,
    *,
    stall: float,
    dead_after: float,
    wake_fd: int | Loop,
    keep: int,
    relay: bool = True,
    progress: ProgressFn | None = None,
) -> dict[str, HostCopy]:
    """Every host's copy of `workdir`, by host name; HostError names a host that failed or went silent.

    As in the probe, the wait gives up when nothing moved for `stall` seconds; a host whose link carries
    heartbeats is lost, as during the run, once it has been silent for `dead_after` seconds. `relay`: hosts
    with the copy feed others (remote hosts the launcher reached directly, so others can reach them too).
    `wake_fd`: the job's loop (--timeout, signals, `distrun stacks`), or a signal pipe's fd for a loop of
    its own.
    """
    loop = wake_fd if isinstance(wake_fd, Loop) else Loop(wake_fd, check_every=1.0)
    token = os.urandom(16).hex() if relay else ""
    request = SyncRequest(project_key(str(workdir.root)), workdir.entries, workdir.manifest_hash, keep, token)
    for node in nodes:
        node.send(SYNC, request)
    phase = Syncing(
        nodes, workdir, stall=stall, dead_after=dead_after, relay=relay, token=token, progress=progress
    )
    try:
        loop.run(phase)
    finally:
        phase.cancel()  # given up (a signal, --timeout, a lost host): no more objects go out
    return phase.copies
