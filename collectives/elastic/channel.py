"""The rank's end of its agent's elastic channel: a Unix socket the agent opens per rank and names in
``DISTRUN_ELASTIC_SOCKET``, carrying one JSON object per line.

The rank's first use of ``hvd.elastic`` connects, which tells the agent that this rank opted in (a rank that
never did cannot be kept alive through a reset). From the agent: ``hosts_updated`` (a commit will raise
HostsUpdatedInterrupt), ``peer_lost`` (a rank of the world is gone: abort what waits for it), ``reset`` (the
new world's environment) or ``leave`` (this rank is not in it). To the agent: ``hello``, ``ready`` (at the
reset point, rolled back) and ``synced`` (the new world's first collective is done).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from collectives import links

__all__ = ["SOCKET_VAR", "Channel", "NewWorld", "open_channel"]

SOCKET_VAR = "DISTRUN_ELASTIC_SOCKET"


@dataclass(frozen=True)
class NewWorld:
    """What a reset tells a rank: its new environment, or None when it leaves the job."""

    env: Mapping[str, str] | None


HostsListener = Callable[[float, int], None]


class Channel:
    """One connection to the agent, read by a daemon thread so that a peer's loss is seen while the rank is
    blocked in a collective."""

    def __init__(self, sock: socket.socket, on_peer_lost: Callable[[], None]) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._worlds: queue.Queue[NewWorld] = queue.Queue()
        self._listeners: list[HostsListener] = []
        self._on_peer_lost = on_peer_lost
        self.peer_lost = threading.Event()
        threading.Thread(target=self._read, name="collectives-elastic", daemon=True).start()

    def send(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, **fields}).encode() + b"\n"
        with self._send_lock:
            self._sock.sendall(line)

    def listen(self, listener: HostsListener) -> None:
        """Hand host updates to ``listener``; the first one also opts this rank in (``hello``), so that no
        update the agent sends from then on can miss it."""
        self._listeners.append(listener)
        if len(self._listeners) == 1:
            self.send("hello", pid=os.getpid())

    def forget(self, listener: HostsListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def next_world(self) -> NewWorld:
        """Block until the agent says where this rank goes."""
        return self._worlds.get()

    def _read(self) -> None:
        for raw in self._sock.makefile("rb"):
            message = json.loads(raw)
            kind = message["kind"]
            if kind == "hosts_updated":
                for listener in list(self._listeners):
                    listener(float(message["timestamp"]), int(message["update"]))
            elif kind == "peer_lost":
                self.peer_lost.set()
                self._on_peer_lost()
            elif kind == "reset":
                # The peer-lost mark was the old world's; cleared here, in the order the agent spoke, so that
                # a peer the new world loses before it forms is not missed.
                self.peer_lost.clear()
                links.rearm()
                self._worlds.put(NewWorld(dict(message["env"])))
            elif kind == "leave":
                self._worlds.put(NewWorld(None))
        # The agent is gone: the launcher is ending the job, and this rank has no world to go to.
        self._worlds.put(NewWorld(None))


_channel: Channel | None = None
_lock = threading.Lock()


def open_channel(on_peer_lost: Callable[[], None]) -> Channel | None:
    """This process's channel, connected on first use; None without distrun's elastic mode."""
    global _channel
    with _lock:
        path = os.environ.get(SOCKET_VAR)
        if _channel is None and path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            _channel = Channel(sock, on_peer_lost)
        return _channel
