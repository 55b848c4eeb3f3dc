"""`--workdir`: bring the copy to every host's cache over the agent links, each host sent only what it lacks.

Every agent gets the manifest (SYNC) and answers with the content hashes it lacks (WANT); the launcher sends
those objects (BLOB), each compressed once (zlib, where that saves a tenth or more) and the same bytes to
every host that wants it; the agent answers SYNCED once its copy is complete. Senders run one thread per
host, so a slow host does not hold up the others; the main thread reads answers and notices lost hosts as
the probe does.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.errors import HostError, Interrupted
from launcher.node import Node
from launcher.progress import Progress, ProgressFn, StallDeadline
from launcher.protocol import (
    BLOB,
    BLOB_HEADER,
    BLOB_ZLIB,
    SYNC,
    SYNCED,
    WANT,
    Synced,
    SyncRequest,
    Want,
    decode_message,
    encode,
    encode_message,
)
from launcher.supervise import STOP_SIGNALS, read_signals
from launcher.wdfiles import Workdir, WorkdirFile

log = logging.getLogger(__name__)

# Compressed content is sent only when it is this much smaller (code compresses well; weights do not).
WORTH_COMPRESSING = 0.9


@dataclass(frozen=True)
class HostCopy:
    """Where one host's copy is, the manifest hash it computed, and what it took to get it there."""

    path: str
    manifest_hash: str
    files_sent: int
    bytes_sent: int


def project_key(root: str) -> str:
    """Which copies are versions of one project, for pruning: this machine and the directory."""
    return f"{socket.gethostname()}:{root}"


class Blobs:
    """Each object's BLOB frame, read, checked and compressed once however many hosts want it."""

    def __init__(self, workdir: Workdir) -> None:
        self._files = workdir.by_digest()
        self._root = workdir.root
        self._frames: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def frame(self, digest: str) -> bytes:
        with self._lock:
            ready = self._frames.get(digest)
        if ready is not None:
            return ready
        made = self._make(self._files[digest])
        with self._lock:
            return self._frames.setdefault(digest, made)

    def _make(self, entry: WorkdirFile) -> bytes:
        import hashlib

        try:
            data = (self._root / entry.path).read_bytes()
        except OSError as err:
            raise HostError(f"--workdir: cannot read {entry.path} any more: {err.strerror}") from None
        if hashlib.sha256(data).hexdigest() != entry.digest:
            raise HostError(f"--workdir: {entry.path} changed while it was being sent; launch again")
        flags = 0
        packed = zlib.compress(data, 1)
        if len(packed) < WORTH_COMPRESSING * len(data):
            flags, data = BLOB_ZLIB, packed
        return encode(BLOB, -1, BLOB_HEADER.pack(flags, bytes.fromhex(entry.digest)) + data)


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
                frame = self.blobs.frame(digest)
                self.node.send(frame)
                self.sent += len(frame)
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
    progress: ProgressFn | None = None,
) -> dict[str, HostCopy]:
    """Every host's copy of `workdir`, by host name; HostError names a host that failed or went silent.

    As in the probe, the wait gives up when nothing moved for `stall` seconds; a host whose link carries
    heartbeats is lost, as during the run, once it has been silent for `dead_after` seconds.
    """
    request = SyncRequest(project_key(str(workdir.root)), workdir.entries, workdir.manifest_hash, keep)
    frame = encode_message(SYNC, request)
    for node in nodes:
        node.send(frame)
    blobs = Blobs(workdir)
    senders: dict[str, _Sender] = {}
    done: dict[str, HostCopy] = {}
    deadline = StallDeadline(stall, time.monotonic())
    moved = 0
    with selectors.DefaultSelector() as sel:
        sel.register(wake_fd, selectors.EVENT_READ, None)
        for node in nodes:
            sel.register(node.link, selectors.EVENT_READ, node)
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
            for key, _ in sel.select(min(1.0, deadline.remaining(now))):
                node = key.data
                if node is None:
                    stops = bytes(s for s in read_signals(wake_fd) if s in STOP_SIGNALS)
                    if stops:
                        raise Interrupted.from_signals(stops)
                    continue
                frames = node.read()
                if frames is None:
                    detail = node.diagnostics()
                    raise _lost(
                        node, "the link closed while syncing the workdir" + (f": {detail}" if detail else "")
                    )
                for kind, _, payload in frames:
                    deadline.progressed(time.monotonic())
                    if kind == WANT:
                        wanted = decode_message(Want, payload).digests
                        sender = _Sender(node, wanted, blobs)
                        senders[node.name] = sender
                        sender.start()
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
                            len(fed.digests) if fed else 0,
                            fed.sent if fed else 0,
                        )
                        sel.unregister(node.link)
                        if progress is not None:
                            progress(Progress("syncing the workdir", len(nodes), len(done)))
    return done
