"""`--workdir`: bring the copy to every host's cache, each host sent only what it lacks.

Every agent gets the manifest (SYNC) and answers with the content hashes it lacks (WANT). A host is then fed
either by the launcher over its agent link (BLOBs, each compressed once, zlib where that saves a tenth or
more, and the same bytes for every host), or, with relaying on, by a peer host (FETCH: the host gets the
objects from the peer over TCP, each as soon as the peer has it; see launcher.agent.receive). `Chain` decides
who
feeds whom: hosts form a chain fed by the launcher at its head, so the launcher's uplink carries one copy,
not one per host, and all hosts receive at once. A fetch that fails falls back to the launcher. The agent
answers SYNCED once its copy is complete.

Senders run one thread per host; the main thread reads answers and notices lost hosts as the probe does.
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
    Synced,
    SyncRequest,
    Want,
    decode_message,
)
from launcher.console.progress import Progress, ProgressFn, StallDeadline
from launcher.errors import HostError, Interrupted
from launcher.job.node import Node
from launcher.signals import Waiter, stopping
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
    """Sends one host the objects it asked for; a send error is kept for the main thread to report."""

    def __init__(self, node: Node, digests: Sequence[str], blobs: Blobs) -> None:
        super().__init__(name=f"workdir-{node.name}", daemon=True)
        self.node, self.digests, self.blobs = node, digests, blobs
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for digest in self.digests:
                body = self.blobs.body(digest)
                self.node.send(BLOB, body)
                self.sent += len(body)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc


def sync(
    nodes: Sequence[Node],
    workdir: Workdir,
    *,
    stall: float,
    dead_after: float,
    wake_fd: int,
    keep: int,
    relay: bool = True,
    progress: ProgressFn | None = None,
) -> dict[str, HostCopy]:
    """Every host's copy of `workdir`, by host name; HostError names a host that failed or went silent.

    As in the probe, the wait gives up when nothing moved for `stall` seconds; a host whose link carries
    heartbeats is lost, as during the run, once it has been silent for `dead_after` seconds. `relay`: hosts
    with the copy feed others (remote hosts the launcher reached directly, so others can reach them too).
    """
    token = os.urandom(16).hex() if relay else ""
    request = SyncRequest(project_key(str(workdir.root)), workdir.entries, workdir.manifest_hash, keep, token)
    for node in nodes:
        node.send(SYNC, request)
    by_name = {node.name: node for node in nodes}
    blobs = Blobs(workdir)
    senders: dict[str, _Sender] = {}
    wanted: dict[str, list[str]] = {}
    ports: dict[str, int] = {}
    # Relaying needs hosts others can reach: remote ones the launcher reached directly (not through a proxy).
    servers = [n for n in nodes if not n.local and n.link.peer_addr]
    chain = Chain(relay and len(servers) > 1)
    done: dict[str, HostCopy] = {}
    deadline = StallDeadline(stall, time.monotonic())
    moved = 0

    def feed(name: str, feeder: str | None) -> None:
        node = by_name[name]
        if feeder is None:
            senders[name] = _Sender(node, wanted[name], blobs)
            senders[name].start()
            return
        peer = by_name[feeder]
        addr = peer.link.peer_addr
        assert addr is not None, "only hosts with an address serve"
        node.send(FETCH, FetchRequest(addr, ports[feeder], token, wanted[name]))

    with Waiter[Node](wake_fd) as waiter:
        for node in nodes:
            waiter.register(node.link, node)
        while len(done) < len(nodes):
            now = time.monotonic()
            for sender in senders.values():
                if sender.error is not None:
                    if isinstance(sender.error, HostError):
                        raise sender.error
                    raise _lost(sender.node, f"sending the workdir failed: {sender.error}")
            if (total := sum(s.sent for s in senders.values())) != moved:
                moved = total
                deadline.progressed(now)  # bytes still going out: not a stall
            for node in nodes:
                silent = now - node.last_heard > dead_after > 0
                if node.name not in done and node.link.heartbeat and silent:
                    raise _lost(node, f"silent for {dead_after:g}s while syncing the workdir")
            if deadline.remaining(now) <= 0:
                name = next(n.name for n in nodes if n.name not in done)
                raise HostError(f"host {name}: no answer while syncing the workdir for {stall:g}s", host=name)
            received, ready = waiter.wait(min(1.0, deadline.remaining(now)))
            if stops := stopping(received):
                raise Interrupted.from_signals(stops)
            for node in ready:
                frames = node.read()
                if frames is None:
                    detail = node.diagnostics()
                    raise _lost(
                        node, "the link closed while syncing the workdir" + (f": {detail}" if detail else "")
                    )
                for kind, _, _, payload in frames:
                    deadline.progressed(time.monotonic())
                    if kind == WANT:
                        want = decode_message(Want, payload)
                        wanted[node.name] = want.digests
                        serves = bool(want.serve_port and node.link.peer_addr) and not node.local
                        if serves:
                            ports[node.name] = want.serve_port
                        if want.error:  # a peer failed it
                            log.info(
                                "host %s: fetching the workdir failed (%s); sending it", node.name, want.error
                            )
                            chain.fallback(node.name)
                            feed(node.name, None)
                        elif not want.digests:
                            if serves:
                                chain.has_copy(node.name)
                        elif node.local:
                            feed(node.name, None)  # a pipe on this machine: no uplink to spare
                        else:
                            feed(node.name, chain.want(node.name, serves))
                    elif kind == SYNCED:
                        synced = decode_message(Synced, payload)
                        if synced.error:
                            raise HostError(f"host {node.name}: {synced.error}", host=node.name)
                        fed = senders.get(node.name)
                        if fed is not None:
                            fed.join()
                        done[node.name] = HostCopy(
                            synced.path,
                            synced.manifest_hash,
                            len(wanted.get(node.name, ())),
                            fed.sent if fed else 0,
                            synced.from_peers,
                            chain.fed_by.get(node.name),
                        )
                        waiter.unregister(node.link)
                        if progress is not None:
                            progress(Progress("syncing the workdir", len(nodes), len(done)))
    return done
