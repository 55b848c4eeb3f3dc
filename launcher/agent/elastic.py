"""The agent's side of elastic resets: one Unix socket per rank, named in the rank's environment
(`DISTRUN_ELASTIC_SOCKET`, read by collectives.elastic), one JSON object per line.

A rank that connects has opted in: it can be kept alive through a reset. The agent tells it that a peer is
gone (`peer_lost`), that hosts changed (`hosts_updated`), and where it goes (`reset`, with its new
environment, or `leave`); the rank says it is at the reset point (`ready`) and when the new world's first
collective is done (`synced`, with the seconds since it stopped). Stdlib-only and Python 3.7 compatible: it
is shipped to remote hosts with the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket

from launcher.agent.elastic_messages import Notice, RankSynced, Ready
from launcher.agent.facts import free_port
from launcher.agent.protocol import OPTED_IN, RANK_READY, RANK_SYNCED

SOCKET_VAR = "DISTRUN_ELASTIC_SOCKET"


class RankLine:
    """One rank's socket: listening until the rank connects, then its connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.conn: socket.socket | None = None
        self.buffer = b""
        self.pid: int | None = None
        self.ready = False
        self.synced: float | None = None
        self.closed = False
        # What the launcher was told already (launcher.agent.server sends each change once).
        self.told_hello = False
        self.told_ready = False

    def send(self, message: dict[str, object]) -> bool:
        """False when the rank is gone (its messages no longer matter)."""
        if self.conn is None or self.closed:
            return False
        try:
            self.conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            self.closed = True
            return False
        return True

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()
        self.closed = True
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ElasticLines:
    """Every rank's line on this host, keyed by the rank's id (its first global rank, which stays its name
    through resets); `poll` reads whatever arrived."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lines: dict[int, RankLine] = {}
        self.selector = selectors.DefaultSelector()

    def open(self, rank_id: int) -> str:
        """The socket path to name in the rank's environment."""
        path = os.path.join(self.directory, f"elastic-{rank_id}.sock")
        line = RankLine(path)
        self.lines[rank_id] = line
        self.selector.register(line.listener, selectors.EVENT_READ, (rank_id, True))
        return path

    def fileno(self) -> int:
        """Readable when a line has news: the agent waits on this with its own selector."""
        return self.selector.fileno()

    def news(self, rank_id: int) -> list[str]:
        """What changed on the rank's line since last asked: `hello`, `ready`, `synced`, each once."""
        line = self.lines[rank_id]
        said = []
        if line.pid is not None and not line.told_hello:
            line.told_hello = True
            said.append("hello")
        if line.ready and not line.told_ready:
            line.told_ready = True
            said.append("ready")
        if line.synced is not None:
            said.append("synced")
        return said

    def take_synced(self, rank_id: int) -> float | None:
        line = self.lines[rank_id]
        seconds, line.synced = line.synced, None
        return seconds

    def opted_in(self, rank_id: int) -> bool:
        line = self.lines.get(rank_id)
        return line is not None and line.pid is not None

    def poll(self, timeout: float) -> list[int]:
        """Read what arrived within `timeout`; the ranks whose line changed."""
        changed: list[int] = []
        for key, _ in self.selector.select(timeout):
            rank_id, listening = key.data
            line = self.lines[rank_id]
            if listening:
                conn, _ = line.listener.accept()
                self.selector.unregister(line.listener)
                line.conn = conn
                self.selector.register(conn, selectors.EVENT_READ, (rank_id, False))
            else:
                self._read(rank_id, line)
            changed.append(rank_id)
        return changed

    def _read(self, rank_id: int, line: RankLine) -> None:
        assert line.conn is not None
        try:
            data = line.conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(line.conn)
            line.closed = True
            return
        line.buffer += data
        while b"\n" in line.buffer:
            raw, line.buffer = line.buffer.split(b"\n", 1)
            message = json.loads(raw.decode())
            kind = message.get("kind")
            if kind == "hello":
                line.pid = int(message["pid"])
            elif kind == "ready":
                line.ready = True
            elif kind == "synced":
                line.synced = float(message["seconds"])

    def peer_lost(self, survivors: list[int]) -> None:
        for rank_id in survivors:
            if rank_id in self.lines:
                self.lines[rank_id].send({"kind": "peer_lost"})

    def hosts_updated(self, timestamp: float, update: int, ranks: list[int] | None = None) -> None:
        for rank_id, line in self.lines.items():
            if ranks is None or rank_id in ranks:
                line.send({"kind": "hosts_updated", "timestamp": timestamp, "update": update})

    def reset(self, rank_id: int, env: dict[str, str] | None) -> bool:
        """Send the rank its new world's environment, or `leave` (None); False if it is gone."""
        line = self.lines[rank_id]
        line.ready = line.told_ready = False
        line.synced = None
        if env is None:
            return line.send({"kind": "leave"})
        return line.send({"kind": "reset", "env": env})

    # -- the launcher's frames, and what the ranks said as frames for it

    def on_notice(self, notice: Notice) -> None:
        if notice.kind == "hosts_updated":
            self.hosts_updated(notice.timestamp, notice.update, notice.ranks)
        else:
            self.peer_lost(notice.ranks)

    def leave(self, ranks: list[int]) -> list[int]:
        """These ranks leave the job; those that never opted in are returned (no line to tell them on). One
        opted in but not at its reset point (a newcomer in its world's first sync, which lost a peer) hears
        `peer_lost` first, so that its wait ends and it reaches the point it leaves from."""
        for rank_id in ranks:
            line = self.lines.get(rank_id)
            if line is not None and not line.ready:
                line.send({"kind": "peer_lost"})
        self.on_reset(dict.fromkeys(ranks))
        return [rank_id for rank_id in ranks if not self.opted_in(rank_id)]

    def on_reset(self, envs: dict[int, dict[str, str] | None]) -> None:
        """Each of these ranks' new environment (None: it leaves the job)."""
        for rank_id, env in envs.items():
            if rank_id in self.lines:
                self.reset(rank_id, env)

    def frames(self) -> list[tuple[int, object, int]]:
        """(kind, message or None, rank) for the launcher, from what the ranks said since the last look."""
        out: list[tuple[int, object, int]] = []
        for rank_id in self.poll(0):
            for news in self.news(rank_id):
                if news == "hello":
                    out.append((OPTED_IN, None, rank_id))
                elif news == "ready":
                    out.append((RANK_READY, Ready(free_port()), rank_id))
                else:
                    out.append((RANK_SYNCED, RankSynced(self.take_synced(rank_id) or 0.0), rank_id))
        return out

    def close(self) -> None:
        for line in self.lines.values():
            if line.conn is not None and not line.closed:
                self.selector.unregister(line.conn)
            line.close()
        self.selector.close()
