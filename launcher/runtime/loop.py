"""The job's one wait loop: every phase that waits on the hosts (the probe, the workdir sync, the host
discovery and the pause before a restart, a running attempt) runs on `Loop`, so that `--timeout`, Ctrl-C,
Ctrl-Z, a lost host and `distrun stacks` are handled the same way in each.

`Loop` owns what every phase shares: the signal pipe, the job's deadline, the clock's stalls (this process
stopped or starved), the hosts' liveness, the control socket, and reading frames, which it hands to the
phase's kind -> handler table. A `Phase` says what it waits for and how it reacts; its defaults are the job's
common behaviour before any rank runs (a stopping signal raises Interrupted, the deadline DeadlineReached, a
lost host HostError), and a phase overrides only what differs (the running attempt stops its ranks instead).
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from launcher.agent.protocol import SIGNAL, Handlers, SignalRequest, dispatch
from launcher.core.result import TimedOut
from launcher.errors import DeadlineReached, HostError, Interrupted, signal_name
from launcher.runtime.control import REQUEST_TOP, ControlServer, answer_busy
from launcher.runtime.node import Node
from launcher.signals import Waiter, stopping, suspend_self

C = TypeVar("C")  # what a phase knows a host by (a Node, an attempt's HostAttempt), handed to its handlers


def forward_signal(nodes: Sequence[Node], signum: int) -> None:
    """Have every agent send `signum` to its running ranks (SIGSTOP/SIGCONT also pause its watch)."""
    request = SignalRequest(signal_name(signum))
    for node in nodes:
        node.send(SIGNAL, request)
        if signum in (signal.SIGSTOP, signal.SIGCONT):
            node.told_to_wait(signum == signal.SIGSTOP)


class Phase(Generic[C]):
    """One phase of the job on the loop. `sources`: each host it listens to, as (node, what the handlers get);
    `handlers`: its frames by kind, each called `handler(context, now, frame, message)`."""

    def __init__(self, sources: Sequence[tuple[Node, C]], dead_after: float) -> None:
        self.sources = list(sources)
        self._node_of = {id(context): node for node, context in self.sources}
        self.dead_after = dead_after
        self.handlers: Handlers = {}
        # Hosts and fds it began to listen to while the loop ran (an elastic job's new host, the discovery
        # script's next run): the loop registers them at its next pass.
        self.added: list[tuple[Node, C]] = []
        self.added_watches: list[tuple[Any, Callable[[float], bool]]] = []
        self.busy_briefly = False  # a phase run while the attempt's ranks run (a host joining it)

    # -- what it is waiting for

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def listening(self, context: C) -> bool:
        """Whether it still waits for word from this host (False: the loop stops reading its link)."""
        return True

    def doing(self, now: float) -> str:
        """What the job is doing, for `distrun stacks` when no rank runs: `restarting in 3s`."""
        raise NotImplementedError

    def next_due(self) -> float | None:
        """When (time.monotonic()) it wants `on_tick` besides the loop's regular checks."""
        return None

    def watches(self) -> Sequence[tuple[Any, Callable[[float], bool]]]:
        """Other fds it waits on (a discovery script's pipes), each with what to call when it is readable;
        that returns whether to go on watching it."""
        return ()

    def next_wake(self) -> float | None:
        """When it wants `after_events` at the latest, with no tick (the relay's held-back output)."""
        return None

    # -- events; the defaults are the job's behaviour while no rank runs

    def on_tick(self, now: float) -> None:
        self.check_liveness(now)

    def node_of(self, context: C) -> Node:
        return self._node_of[id(context)]

    def add_source(self, node: Node, context: C) -> None:
        """A host it listens to from now on (registered by the loop at its next pass)."""
        self.sources.append((node, context))
        self._node_of[id(context)] = node
        self.added.append((node, context))

    def add_watch(self, fileobj: Any, on_ready: Callable[[float], bool]) -> None:
        """An fd it waits on from now on, as `watches` (registered by the loop at its next pass)."""
        self.added_watches.append((fileobj, on_ready))

    def check_liveness(self, now: float) -> None:
        """Hosts it listens to that have been silent longer than their agents' heartbeats allow are lost."""
        for node, context in self.sources:
            silent = node.silent_for(now)
            if silent > self.dead_after and self.listening(context):
                self.on_silent(context, silent, now)

    def on_silent(self, context: C, seconds: float, now: float) -> None:
        node = self.node_of(context)
        node.drop()
        raise HostError(
            f"host {node.name}: no word from it for {seconds:.0f}s while {self.doing(now)}", host=node.name
        )

    def on_closed(self, context: C, now: float) -> None:
        node = self.node_of(context)
        detail = node.diagnostics()
        node.drop()
        raise HostError(
            f"host {node.name}: the link closed while {self.doing(now)}" + (f": {detail}" if detail else ""),
            host=node.name,
        )

    def on_signals(self, received: bytes, now: float) -> None:
        """Signals received (one byte each, in arrival order). A stopping one (SIGINT, SIGTERM, ...) raises
        Interrupted: nothing runs yet, so there is nothing to stop."""
        if stops := stopping(received):
            raise Interrupted.from_signals(stops)
        for signum in received:
            self.on_signal(signum, now)

    def on_signal(self, signum: int, now: float) -> None:
        """Any other handled signal. Ctrl-Z stops the agents' watch (no rank runs to stop) and this process;
        SIGCONT (`fg`) resumes them."""
        nodes = [node for node, _ in self.sources if not node.lost]
        if signum == signal.SIGTSTP:
            forward_signal(nodes, signal.SIGSTOP)
            suspend_self()
        elif signum == signal.SIGCONT:
            forward_signal(nodes, signal.SIGCONT)

    def on_deadline(self, now: float, deadline: Deadline) -> None:
        """--timeout expired (the loop calls this once)."""
        raise deadline.error(self.doing(now))

    def on_stall(self, seconds: float, now: float) -> None:
        """distrun did not run for `seconds`: nobody could be heard meanwhile (the loop excused the hosts)."""

    def on_control(self, conn: socket.socket, now: float) -> None:
        """`distrun stacks` asks: no rank runs (or, `busy_briefly`, the loop is busy while they do), so the
        answer is what the job is doing, at once."""
        answer_busy(conn, self.doing(now), briefly=self.busy_briefly)

    def after_events(self, now: float) -> None:
        """After each wake-up's events were handled."""


@dataclass(frozen=True)
class Deadline:
    """--timeout: `seconds` counted from `started` (time.monotonic()), in every phase of the job.

    The job's one deadline: its Loop holds it, and whatever ends at it (a phase, a restart, the measurement
    of --preflight) asks it the time left and for the error or the outcome that says it passed.
    """

    seconds: float | None = None
    started: float = 0.0

    @property
    def at(self) -> float | None:
        """The instant (time.monotonic()); None: no --timeout."""
        return self.started + self.seconds if self.seconds else None

    def left(self, now: float) -> float | None:
        """Seconds to go (<= 0 once passed); None: no --timeout."""
        at = self.at
        return None if at is None else at - now

    def passed(self, now: float) -> bool:
        at = self.at
        return at is not None and now >= at

    def error(self, doing: str) -> DeadlineReached:
        """Before any rank runs: the job ends with exit 124 and this line."""
        return DeadlineReached(f"--timeout expired while {doing}")

    def outcome(self, stopped: tuple[int, ...] = ()) -> TimedOut:
        """Once ranks ran (or between attempts): the job's outcome."""
        return TimedOut(self.seconds or 0.0, stopped)


NO_DEADLINE = Deadline()


class Loop:
    """Waits for the job: the signal pipe, the job's `Deadline`, the control socket, and every link a phase
    listens to; checks liveness and the deadline every `check_every`."""

    def __init__(
        self,
        wake_fd: int,
        *,
        deadline: Deadline | None = None,
        check_every: float,
        control: ControlServer | None = None,
    ) -> None:
        self.wake_fd = wake_fd
        self.deadline = deadline or NO_DEADLINE
        self.check_every = check_every
        self.control = control

    def run(self, phase: Phase[C]) -> None:
        """Feed `phase` its events until it is done (or a handler raises)."""
        now = time.monotonic()
        for node, _ in phase.sources:
            node.excuse(now)  # nobody listened to it before this phase
        deadline_told = False
        deadline = self.deadline.at
        # Registrations: (node, context) for a link, (fd, on_ready) for a phase's own fd, None for the control
        # socket.
        with Waiter[tuple[Any, Any] | None](self.wake_fd) as waiter:
            if self.control is not None:
                waiter.register(self.control, None)
            for fileobj, on_ready in phase.watches():
                waiter.register(fileobj, (fileobj, on_ready))
            # The links it reads, by id(node): their fds as registered, for a link torn down (fd closed) since
            # can no longer say its number.
            registered: dict[int, int] = {}
            for node, context in phase.sources:
                if not node.lost and phase.listening(context):
                    fd = node.link.fileno()
                    waiter.register(fd, (node, context))
                    registered[id(node)] = fd
            next_check = now + self.check_every
            handlers = phase.handlers
            ran = now  # the last instant this loop is known to have run
            while not phase.done:
                now = time.monotonic()
                while phase.added_watches:
                    fileobj, on_ready = phase.added_watches.pop(0)
                    waiter.register(fileobj, (fileobj, on_ready))
                while phase.added:
                    node, context = phase.added.pop(0)
                    node.excuse(now)
                    if not node.lost and phase.listening(context):
                        fd = node.link.fileno()
                        waiter.register(fd, (node, context))
                        registered[id(node)] = fd
                if now - ran > self.check_every:
                    # Stopped between two passes: by Ctrl-Z (a phase suspends us after its events), or by a
                    # SIGSTOP at that instant. Nobody could be heard meanwhile.
                    self._excuse(phase, now)
                    phase.on_stall(now - ran, now)
                wait = next_check - now
                if deadline is not None and not deadline_told:
                    wait = min(wait, deadline - now)
                due = phase.next_due()
                for at in (due, phase.next_wake()):
                    if at is not None:
                        wait = min(wait, at - now)
                wait = max(0.0, wait)
                received, ready = waiter.wait(wait)
                selected = time.monotonic()
                overslept = selected - now - wait
                if overslept > self.check_every:
                    # Our clock jumped past the wait: this process was stopped (SIGSTOP) or starved meanwhile.
                    self._excuse(phase, selected)
                    phase.on_stall(overslept, selected)
                if signal.SIGCONT in received:
                    # Continued: whenever the stop began (a SIGSTOP can land anywhere), its silence was ours.
                    self._excuse(phase, selected)
                if received:
                    phase.on_signals(received, selected)
                for source in ready:
                    if source is None:
                        self._on_control(phase, selected)
                        continue
                    node, context = source
                    if not isinstance(node, Node):  # a phase's own fd
                        if not context(selected):
                            waiter.unregister(node)
                        continue
                    frames = node.read()
                    if frames is None:
                        waiter.unregister(registered.pop(id(node)))
                        phase.on_closed(context, selected)
                        continue
                    for frame in frames:
                        dispatch(handlers, frame, context, selected)
                    if not phase.listening(context):
                        waiter.unregister(registered.pop(id(node)))
                now = time.monotonic()
                phase.after_events(now)
                if now - selected > self.check_every:
                    # Our own loop was stuck (a console that does not read): nobody could be heard meanwhile.
                    # (The heartbeat thread went on, so the agents heard us.)
                    self._excuse(phase, now)
                late = deadline is not None and now >= deadline and not deadline_told
                if now >= next_check or late or (due is not None and now >= due):
                    next_check = now + self.check_every
                    if late:
                        deadline_told = True
                        phase.on_deadline(now, self.deadline)
                    phase.on_tick(now)
                    for node, context in phase.sources:
                        # A host the tick gave up is read no more (its link is torn down).
                        if id(node) in registered and not phase.listening(context):
                            waiter.unregister(registered.pop(id(node)))
                ran = now

    def _excuse(self, phase: Phase[C], now: float) -> None:
        for node, _ in phase.sources:
            node.excuse(now)

    def _on_control(self, phase: Phase[C], now: float) -> None:
        assert self.control is not None
        accepted = self.control.accept_request()
        if accepted is None:
            return
        conn, request = accepted
        if request == REQUEST_TOP:  # `distrun top`: the same in every phase, what is known now
            self.control.answer_top(conn, phase.doing(now))
        else:
            phase.on_control(conn, now)
