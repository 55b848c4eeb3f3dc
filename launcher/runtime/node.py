"""The two records of a host: `Node`, its agent connection for the job's life (link, frame decoder,
liveness), and `HostAttempt`, its part of one attempt (slots, facts, finished), made fresh by each attempt.
`connect` makes Nodes through the job's backend."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.agent.protocol import (
    BEAT,
    HELLO,
    VERSION,
    Facts,
    Frame,
    FrameReader,
    Hello,
    decode_message,
    encode,
    encode_message,
)
from launcher.backends import api as backend
from launcher.backends.link import Acknowledging, Link, Prefaced, abort, opening
from launcher.backends.local import LocalTransport
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.core.plan import Slot
from launcher.core.progress import ProgressFn
from launcher.errors import HostError
from launcher.runtime.control import ControlServer, answering

log = logging.getLogger(__name__)

# Agent ids, unique within this launcher: hosts that join a job later get fresh ones.
_agent_ids = itertools.count()

# How much longer than distrun an agent waits before it gives up on distrun: what can hold our word back once
# a network outage shorter than distrun's own limit is over. A beat interval (at most 1 s), our TCP's
# retransmission cap (1 s: launcher.backends.ssh.tcp), and slack. distrun is then the side that decides.
AGENT_MARGIN = 2.5


def agent_patience(dead_after: float) -> float:
    """The silence after which an agent stops its ranks, given distrun's `dead_after` (0: it never does)."""
    return dead_after + AGENT_MARGIN if dead_after else 0.0


class Node:
    """A host with a running agent, for as long as the job keeps it. `lost`: the link is gone (dropped, or
    the host stopped answering); nothing is sent to it any more."""

    def __init__(
        self, host: Host, link: Link, local: bool, agent_id: int = 0, dead_after: float = 0.0
    ) -> None:
        self.host = host
        # Names the agent in every frame (launcher.agent.protocol); unique among the job's agents.
        self.agent_id = agent_id
        self.link = link
        self.local = local
        self.reader = FrameReader(after_magic=True)
        self.lost = False
        # Liveness: written only by its methods (`read`, `excuse`; `missed_beats` from the heartbeat thread,
        # `attempt_began`), so that every phase of the job judges silence the same way.
        self._heard = time.monotonic()
        self._frame_at: float | None = None  # when its agent last sent anything (None: not started)
        self._acked = link.acked_ago if isinstance(link, Acknowledging) else None
        # After an outage the host's TCP holds its agent's bytes back until its next retransmission, up to
        # about twice the outage later (RTO doubling): for that long its kernel's acknowledgements of our
        # bytes stand in for its agent's word. A host that only acknowledges beyond that has a silent agent.
        # (Before it sent anything, its login shell runs: --startup-timeout bounds that.)
        self._acks_count_for = 2 * dead_after + AGENT_MARGIN
        self.hello_at: float | None = None  # when its agent said HELLO: its login shell was done
        self._login_said = ""  # what the login shell had written to stderr by then
        # The longest time this attempt that the heartbeat thread did not run (distrun stopped or starved):
        # past the agent's patience, the agent stops its ranks, and that is no fault of the host.
        self.beat_gap = 0.0
        # Whether its agent waits for a stopped distrun however long (a terminal's job: ProbeRequest's
        # `wait_while_stopped`), and when it was last told to (Ctrl-Z's SIGSTOP) and told to stop waiting
        # (SIGCONT): beat gaps it waited through are no reason for it to have given up.
        self.waits_while_stopped = False
        self._told_wait_at: float | None = None
        self._told_resume_at: float | None = None
        # Frames must not interleave: the heartbeat thread and the main loop both send.
        self._send_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def last_heard(self) -> float:
        """When the host last gave word: a frame from its agent, or, for a while after the last one, its
        kernel acknowledging our bytes (the network is back; see launcher.backends.ssh.tcp)."""
        heard = self._heard
        if self._acked is not None:
            now = time.monotonic()
            ago = self._acked()
            if ago is not None and (self._frame_at is None or now - self._frame_at < self._acks_count_for):
                heard = max(heard, now - ago)
        return heard

    @last_heard.setter
    def last_heard(self, when: float) -> None:
        self._heard = when

    # -- liveness

    def silent_for(self, now: float) -> float:
        """Seconds since the host last gave word (0 for a local agent: its pipe closing says it died)."""
        return now - self.last_heard if self.link.heartbeat else 0.0

    def excuse(self, now: float) -> None:
        """Nobody could be heard until `now` (distrun was stopped, starved, or not listening): that silence is
        not the host's."""
        self._heard = max(self._heard, now)

    def missed_beats(self, gap: float, since: float) -> None:
        """The heartbeat thread did not run for `gap` seconds from `since` (its own thread calls this)."""
        with self._send_lock:
            if self.waits_while_stopped or self._told_to_wait_within(since, since + gap):
                return
            self.beat_gap = max(self.beat_gap, gap)

    def told_to_wait(self, waiting: bool) -> None:
        """Its agent was just told that distrun stops (SIGSTOP, Ctrl-Z) or goes on (SIGCONT)."""
        with self._send_lock:
            if waiting:
                self._told_wait_at, self._told_resume_at = time.monotonic(), None
            elif self._told_wait_at is not None:
                self._told_resume_at = time.monotonic()

    def _told_to_wait_within(self, start: float, end: float) -> bool:
        # The heartbeat thread may measure its gap only after the main loop has told the agents to go on.
        told, resumed = self._told_wait_at, self._told_resume_at
        return told is not None and told <= end and (resumed is None or resumed >= start)

    def attempt_began(self) -> None:
        """A new attempt judges distrun's own silences afresh."""
        with self._send_lock:
            self.beat_gap = 0.0

    def we_were_silent(self, patience: float) -> bool:
        """distrun itself (not the host) went unheard longer than its agent waits (`patience`): the agent
        stopped its ranks."""
        return self.link.heartbeat and self.beat_gap > patience

    def send(self, kind: int, message: object = None) -> None:
        """One frame to this node's agent: `message` is the kind's dataclass
        (launcher.agent.protocol.MESSAGES),
        raw bytes for kinds whose body is bytes (BLOB), or nothing for kinds without a body."""
        if message is None or isinstance(message, bytes):
            frame = encode(kind, payload=message or b"", agent=self.agent_id)
        else:
            frame = encode_message(kind, message, agent=self.agent_id)
        with self._send_lock:
            if not self.lost:
                self.link.send(frame)

    def read(self) -> list[Frame] | None:
        """Frames now available (HELLO checked and consumed); None when the link closed."""
        data = self.link.recv()
        if data is None:
            return []
        if not data:
            return None
        self._heard = time.monotonic()
        frames = self.reader.feed(data)
        if frames and frames[0].kind == HELLO:
            hello = decode_message(Hello, frames.pop(0).payload)
            self.hello_at = self._heard
            self._login_said = self._said_so_far()
            if hello.version != VERSION:
                raise HostError(
                    f"host {self.name}: its distrun agent speaks protocol version {hello.version}, "
                    f"this launcher {VERSION}; use the same distrun on both sides",
                    host=self.name,
                )
        if self.hello_at is not None:  # the agent's, not the login shell's
            self._frame_at = self._heard
        return frames

    def drop(self) -> None:
        """The host is gone (or will not finish): no more sends, and its link is torn down."""
        self.lost = True
        self.link.abort()

    def diagnostics(self) -> str:
        """The last line the agent said besides frames, for error messages; before the agent started, the
        last line of the host's login shell. Once the agent runs, what the login shell printed (pyenv's
        complaints, a banner) is no cause of anything and is left out."""
        if self.hello_at is None:
            said = self.reader.preamble.decode(errors="replace") + "\n" + self.link.diagnostics()
        else:
            said = self.link.diagnostics().removeprefix(self._login_said)
        said = said.strip()
        return said.splitlines()[-1] if said else ""

    def login_output(self) -> str:
        """The last line the host's login shell printed (stdout or stderr) before its agent started."""
        said = self.reader.preamble.decode(errors="replace") + "\n"
        said += self._login_said if self.hello_at is not None else self._said_so_far()
        said = said.strip()
        return said.splitlines()[-1] if said else ""

    def _said_so_far(self) -> str:
        # Only a login shell prints before the agent; other links' diagnostics may wait for the agent's end.
        return self.link.said_so_far() if isinstance(self.link, Prefaced) else ""


@dataclass(eq=False)
class HostAttempt:
    """One host's part of one attempt, owned by that attempt: its ranks (`slots`), what its agent reported
    (`facts`, set once the probe answered), and whether the attempt is over there (`finished`: DONE received,
    or the host lost)."""

    node: Node
    slots: tuple[Slot, ...]
    facts: Facts | None = None
    finished: bool = False
    # An elastic job's spare host, probed but without a rank yet: the attempt does not wait for it to end
    # until a reset starts ranks there.
    idle: bool = False
    # Ranks a reset started there (rank ids), beside the slots'.
    sent: set[int] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def link(self) -> Link:
        return self.node.link

    def drop(self) -> None:
        """The host is lost: the attempt is over there too."""
        self.node.drop()
        self.finished = True


def connect(
    hosts: Sequence[Host],
    config: LaunchConfig,
    progress: ProgressFn | None = None,
    *,
    control: ControlServer | None = None,
    doing: str = "starting: connecting to its hosts",
) -> list[Node]:
    """A Node per host, in the order given; all or nothing (HostError names the first failing host).

    The backend (`--launcher`) says which hosts are this machine and starts the agents of the others;
    `progress` hears how far that got. This machine's hosts get a local agent over pipes. While remote hosts
    are reached (the job's loop cannot run then), `distrun stacks` on `control` is told `doing`.
    """
    chosen = backend.get(config.launcher)
    local = chosen.local_hosts(hosts, config)
    remote = [h for h, is_local in zip(hosts, local, strict=True) if not is_local]
    with opening(abort) as links:
        if remote:  # first: it is what can fail
            # Only around the handshakes, which may take long: local agents fork, which wants one thread.
            with answering(control, doing):
                links.update(chosen.open(remote, config, progress))
        links.update(LocalTransport().open([h for h, is_local in zip(hosts, local, strict=True) if is_local]))
    dead_after = chosen.liveness(config).dead_after
    return [
        Node(h, links[h.name], is_local, next(_agent_ids), dead_after)
        for h, is_local in zip(hosts, local, strict=True)
    ]


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
        sent = time.monotonic()
        while not self._done.wait(self._every):
            # From the end of the last beats (a slow send is not silence) to this wake-up: `every`, unless
            # the whole process did not run meanwhile (SIGSTOP), when the agents heard nothing either.
            gap = time.monotonic() - sent
            for node in self._nodes:
                node.missed_beats(gap, sent)
                node.send(BEAT)
            sent = time.monotonic()
