"""The agent's side of a --workdir sync: objects from the launcher or from a peer host, into
`launcher.agent.store`.

Shipped to remote hosts with the agent (see `launcher.backends.bootstrap`): stdlib-only, Python 3.7.

SYNC -> WANT (what this host lacks); then BLOBs from the launcher, or a FETCH naming a peer host; SYNCED once
the copy is complete. Every host serves peers from SYNC on: a TCP listener that answers only a connection
presenting the sync's random token, and only with objects by content hash (each checked against its hash by
the receiver), each as soon as this host has it. So hosts form a chain, each fed by the one before while
that one is still being fed, and the launcher's uplink carries one copy. Serving ends when ranks start
(START), so that no thread runs while ranks are forked.

Peer protocol, one connection per fetch: the client sends `token\\n` and a JSON list of hashes `\\n`; the
server answers, per hash, an 8-byte big-endian length and the content.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any

from launcher.agent.cache_root import default_root
from launcher.agent.protocol import BLOB_HEADER, BLOB_ZLIB, SYNCED, WANT
from launcher.agent.store import Store, StoreError, manifest_hash

if TYPE_CHECKING:  # the --workdir frames' bodies load with the first SYNC (launcher.agent.protocol.ELSEWHERE)
    from launcher.agent.workdir_messages import FetchRequest, SyncRequest

SIZE = struct.Struct("!Q")
PEER_TIMEOUT = 60.0  # without a byte from the peer: it is stuck (what it waits for does not come)
PEER_CONNECT_TIMEOUT = 10.0  # a peer that a firewall hides: the launcher feeds this host instead


def _read_exact(stream: Any, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise OSError("the peer closed the connection")
    return bytes(data)


def listen() -> socket.socket:
    """A socket on a free port of every address (IPv6 and IPv4 at once where the host has IPv6).

    `distrun check` also holds one open for other hosts to connect to: the kernel completes those connections
    (backlog) without the agent ever accepting them."""
    sock = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
    except OSError:
        sock.close()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
    sock.listen(64)
    return sock


class _Server(threading.Thread):
    """Serves the store's objects to peers presenting `token`, one connection at a time, until `stop`."""

    def __init__(self, store: Store, token: str) -> None:
        super().__init__(name="workdir-serve", daemon=True)
        self.store = store
        self.token = token.encode()
        self.sock = listen()
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:  # noqa: UP041 - not yet TimeoutError on the Python 3.7 a host may have
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(PEER_TIMEOUT)
                with contextlib.suppress(OSError, ValueError, StoreError):
                    self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        stream = conn.makefile("rb")
        if stream.readline().rstrip(b"\n") != self.token:
            return
        for digest in json.loads(stream.readline()):
            path = self.store.object_path(str(digest))  # StoreError (the connection ends) if no hash
            waited = time.monotonic() + PEER_TIMEOUT
            while not os.path.exists(path):  # not here yet: this host is still being fed
                if self._stopping.is_set() or time.monotonic() > waited:
                    return
                time.sleep(0.005)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                conn.sendall(SIZE.pack(size))
                conn.sendfile(f)

    def stop(self) -> None:
        self._stopping.set()
        self.join()
        self.sock.close()


def fetch(store: Store, request: FetchRequest) -> int:
    """Get `request.digests` from the peer into `store` (each checked); the bytes received."""
    received = 0
    with socket.create_connection((request.addr, request.port), timeout=PEER_CONNECT_TIMEOUT) as conn:
        conn.settimeout(PEER_TIMEOUT)
        conn.sendall(request.token.encode() + b"\n" + json.dumps(request.digests).encode() + b"\n")
        stream = conn.makefile("rb")
        for digest in request.digests:
            (size,) = SIZE.unpack(_read_exact(stream, SIZE.size))
            store.put(digest, _read_exact(stream, size))
            received += SIZE.size + size
    return received


class Receiver:
    """A sync in the agent: methods take a request and return the (kind, message) pairs to send back.

    The cache is marked in use (`Store.adding`) from SYNC to SYNCED; the copy stays in use (its lock held)
    until the next sync or the agent's exit. A FETCH runs in a thread; `fileno()` becomes readable when it
    ends, and `fetched()` then gives what to send.
    """

    def __init__(self, root: str | None = None) -> None:
        self.root = root
        self.wanted: set[str] = set()
        self.request: Any = None
        self.store: Store | None = None
        self.received = 0
        self.from_peers = 0
        self.stored: set[str] = set()  # objects stored (and so checked) by this sync
        self._adding: Any = None
        self._in_use: int | None = None
        self._server: _Server | None = None
        self._done_r, self._done_w = os.pipe()
        self._fetch_result: tuple[set[str], int, str] | None = None

    def fileno(self) -> int:
        return self._done_r

    def start(self, request: SyncRequest) -> list[tuple[int, Any]]:
        self.stop_serving()
        self._end_adding()
        self.request = request
        self.received = self.from_peers = 0
        self.stored = set()
        try:
            self.store = Store(self.root or default_root())
            self._adding = self.store.adding()
            self._adding.__enter__()
            # What a killed sync left in tmp/ (a cut transfer's partial file) would fill the disk for good.
            self.store.reclaim()
            # Only now, with pruning held off, the last copy may be let go: a restart finds it still there.
            self._let_go()
            self.wanted = set(self.store.missing(request.entries, request.manifest_hash))
        except (OSError, StoreError) as exc:
            return [self._failed(exc)]
        port = 0
        if request.serve_token:
            try:
                self._server = _Server(self.store, request.serve_token)
                self._server.start()
                port = self._server.port
            except OSError:
                self._server = None  # no peer is fed from here; the launcher feeds them
        from launcher.agent.workdir_messages import Want

        frames: list[tuple[int, Any]] = [(WANT, Want(sorted(self.wanted), "", port))]
        if not self.wanted:
            frames.append(self._finish())
        return frames

    def blob(self, payload: bytes) -> list[tuple[int, Any]]:
        if self.store is None or not self.wanted:
            return []  # after a failure: the rest of the transfer is dropped
        flags, raw = BLOB_HEADER.unpack_from(payload)
        data = payload[BLOB_HEADER.size :]
        self.received += len(payload)
        digest = raw.hex()
        try:
            if flags & BLOB_ZLIB:
                data = zlib.decompress(data)
            self.store.put(digest, data)
        except (OSError, StoreError, zlib.error) as exc:
            self.wanted.clear()
            return [self._failed(exc)]
        self.wanted.discard(digest)
        self.stored.add(digest)
        return [] if self.wanted else [self._finish()]

    def fetch(self, request: FetchRequest) -> list[tuple[int, Any]]:
        store = self.store
        if store is None or not self.wanted:
            return []

        def run() -> None:
            got: set[str] = set()
            received, error = 0, ""
            try:
                received = fetch(store, request)
                got = set(request.digests)
            except (OSError, StoreError, ValueError) as exc:
                error = f"from {request.addr}:{request.port}: {getattr(exc, 'strerror', None) or exc}"
            self._fetch_result = (got, received, error)
            os.write(self._done_w, b"x")

        threading.Thread(target=run, name="workdir-fetch", daemon=True).start()
        return []

    def fetched(self) -> list[tuple[int, Any]]:
        os.read(self._done_r, 64)
        result, self._fetch_result = self._fetch_result, None
        if result is None or self.store is None:
            return []
        got, received, error = result
        self.from_peers += received
        self.wanted -= got
        self.stored |= got
        if error:  # the launcher sends what is still missing itself
            from launcher.agent.workdir_messages import Want

            return [(WANT, Want(sorted(self.wanted), error))]
        return [] if self.wanted else [self._finish()]

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _finish(self) -> tuple[int, Any]:
        request, store = self.request, self.store
        assert store is not None
        try:
            path, built = store.materialize(
                request.entries, request.manifest_hash, request.project, self.stored
            )
            self._in_use = store.use(request.manifest_hash)
        except (OSError, StoreError) as exc:
            return self._failed(exc)
        finally:
            self._end_adding()
        if built:  # only a new copy can push an old one out
            with contextlib.suppress(OSError):
                store.prune(request.keep)
        from launcher.agent.workdir_messages import Synced

        return SYNCED, Synced(path, manifest_hash(request.entries), self.received, "", self.from_peers)

    def _failed(self, exc: BaseException) -> tuple[int, Any]:
        self._end_adding()
        reason = getattr(exc, "strerror", None) or str(exc)
        from launcher.agent.workdir_messages import Synced

        return SYNCED, Synced(error=f"workdir cache {self._where()}: {reason}")

    def _where(self) -> str:
        return self.store.root if self.store is not None else (self.root or default_root())

    def _end_adding(self) -> None:
        if self._adding is not None:
            self._adding.__exit__(None, None, None)
            self._adding = None

    def _let_go(self) -> None:
        if self._in_use is not None:
            os.close(self._in_use)
            self._in_use = None
