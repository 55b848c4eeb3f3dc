"""One record per host of the job: its agent link, the frame decoder for it, and what the current attempt
knows of it (facts, slots). `connect` makes them, choosing each host's transport."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence

from launcher.config import LaunchConfig
from launcher.errors import HostError
from launcher.hosts import Host
from launcher.locality import (
    current_user,
    is_local_host,
    local_addresses,
    refuse_this_machine_twice,
    runs_here,
)
from launcher.plan import Slot
from launcher.progress import ProgressFn
from launcher.protocol import HELLO, VERSION, Facts, FrameReader, Hello, decode_message
from launcher.transport.link import Link, Transport
from launcher.transport.local import LocalTransport

log = logging.getLogger(__name__)


class Node:
    """A host with a running agent. `facts` and `slots` are the current attempt's; `finished` means the
    attempt is over on this host (DONE received, or the link dropped)."""

    def __init__(self, host: Host, link: Link, local: bool) -> None:
        self.host = host
        self.link = link
        self.local = local
        self.reader = FrameReader(after_magic=True)
        self.facts: Facts | None = None
        self.slots: tuple[Slot, ...] = ()
        self.finished = False
        self.lost = False
        self.last_heard = time.monotonic()
        # Frames must not interleave: the heartbeat thread and the main loop both send.
        self._send_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.host.name

    def send(self, frame: bytes) -> None:
        with self._send_lock:
            if not self.lost:
                self.link.send(frame)

    def read(self) -> list[tuple[int, int, bytes]] | None:
        """Frames now available (HELLO checked and consumed); None when the link closed."""
        data = self.link.recv()
        if data is None:
            return []
        if not data:
            return None
        self.last_heard = time.monotonic()
        frames = self.reader.feed(data)
        if frames and frames[0][0] == HELLO:
            hello = decode_message(Hello, frames.pop(0)[2])
            if hello.version != VERSION:
                raise HostError(
                    f"host {self.name}: its distrun agent speaks protocol version {hello.version}, "
                    f"this launcher {VERSION}; use the same distrun on both sides",
                    host=self.name,
                )
        return frames

    def drop(self) -> None:
        """The host is gone (or will not finish): no more sends, and its link is torn down."""
        self.lost = self.finished = True
        self.link.abort()

    def diagnostics(self) -> str:
        """What the agent (or the host's login shell before it) said besides frames, for error messages."""
        said = (self.reader.preamble.decode(errors="replace") + "\n" + self.link.diagnostics()).strip()
        return said.splitlines()[-1] if said else ""


def locality(hosts: Sequence[Host], config: LaunchConfig) -> list[bool]:
    """Which hosts are this machine (they run through a local agent, without SSH).

    A host named with another user (`nobody@localhost`) is never local: only SSH runs it as that user. Two
    entries that are both this machine are refused (HostSpecError): they would share ports and LOCAL_RANKs.
    """
    me = current_user()
    local = [runs_here(h, me) for h in hosts]
    if not all(local):
        from launcher.transport.sshconn import load_ssh_config, resolve_target

        # Judge by what SSH would connect to: ~/.ssh/config may map `node1` to an address, or to this machine.
        ssh_config = load_ssh_config(config.ssh.config_file)
        mine = local_addresses()  # once: listing every interface, per host, was 1.2 s of 256 hosts' launch
        local = [
            is_local
            or (
                h.user in (None, me)
                and is_local_host(resolve_target(h, config.ssh, ssh_config).hostname, mine)
            )
            for h, is_local in zip(hosts, local, strict=True)
        ]
    refuse_this_machine_twice(hosts, local)
    return local


def remote_transport(config: LaunchConfig, progress: ProgressFn | None = None) -> Transport:
    # The agent runs with the interpreter `.py` commands get: --python, else ours if there.
    pythons = [config.python] if config.python else [sys.executable, "python3"]
    if config.launcher == "srun":
        from launcher.transport.srunstep import SrunStepTransport

        return SrunStepTransport(pythons, progress)
    from launcher.transport.ssh import SshTransport

    return SshTransport(config.ssh, pythons, progress)


def connect(hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None) -> list[Node]:
    """A Node per host, in the order given; all or nothing (HostError names the first failing host).

    `progress` hears how far connecting to remote hosts and starting their agents got. Under srun every
    host, this machine included, gets an srun step: Slurm's names need no lookups here."""
    local = [False] * len(hosts) if config.launcher == "srun" else locality(hosts, config)
    groups: list[tuple[Transport, list[Host]]] = [
        (LocalTransport(), [h for h, is_local in zip(hosts, local, strict=True) if is_local]),
    ]
    remote = [h for h, is_local in zip(hosts, local, strict=True) if not is_local]
    if remote:
        groups.insert(0, (remote_transport(config, progress), remote))  # SSH first: it is what can fail
    links: dict[str, Link] = {}
    try:
        for transport, group in groups:
            if group:
                links.update(transport.open(group))
    except BaseException:
        for link in links.values():
            link.abort()
        raise
    return [Node(h, links[h.name], is_local) for h, is_local in zip(hosts, local, strict=True)]


def master_address(given: str | None, local: Sequence[bool], links: Sequence[Link | None]) -> str | None:
    """An address of rank 0's host that every host can reach (never loopback when any host is remote).

    `local[i]`/`links[i]`: whether host i (host 0 holds rank 0) is this machine, and its link (None where it
    could not be reached). None when proxies hide the address: only `--master-addr` can say it then.
    """
    if given:
        return given
    if all(local):
        return "127.0.0.1"
    if not local[0]:
        return links[0].peer_addr if links[0] is not None else None
    # Rank 0 runs here: this machine's address as the remote hosts see it.
    return next(
        (
            link.local_addr
            for link, is_local in zip(links, local, strict=True)
            if link is not None and not is_local and link.local_addr
        ),
        None,
    )


def close_all(nodes: Sequence[Node]) -> None:
    """Close every link: each agent sees EOF, stops what still runs and exits.

    EOF goes to every agent first, so they all stop together: a link's close may wait for its agent (or its
    srun step) to end, and over hundreds of hosts those waits must not add up.
    """
    alive = [node for node in nodes if not node.lost]
    for node in alive:
        node.link.close_input()
    for node in alive:
        node.link.close()


class Heartbeat:
    """Tells agents behind silent-failing links that we are alive, from a thread of its own, so a console
    that blocks the main loop (or a restart delay) cannot make them think we died."""

    def __init__(self, nodes: Sequence[Node], every: float) -> None:
        self._nodes = [n for n in nodes if n.link.heartbeat]
        self._every = every
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, nodes: Sequence[Node]) -> None:
        self._nodes = [*self._nodes, *(n for n in nodes if n.link.heartbeat)]

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _run(self) -> None:
        from launcher.protocol import BEAT, encode

        beat = encode(BEAT)
        while not self._done.wait(self._every):
            for node in self._nodes:
                node.send(beat)
