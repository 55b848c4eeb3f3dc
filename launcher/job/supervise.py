"""Watch one attempt of the job: the preflight probe, then every host's agent until the attempt ends.

`Supervisor` is the attempt's state, fed events (frames, a closed link, a signal, the clock) and deciding what
to send; `supervise` is the thin selector loop that feeds it. Tests drive a Supervisor directly with fake
links. The first failure, a signal, the timeout or a lost host stops every host.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence

from launcher.agent.protocol import (
    DONE,
    ERR,
    EXIT,
    FACTS,
    KILL,
    OUT,
    PROBE,
    SIGNAL,
    STACK_DUMP,
    STOP,
    Facts,
    Frame,
    Handlers,
    ProbeRequest,
    RankExited,
    SignalRequest,
    StackReply,
    StopRequest,
    dispatch,
)
from launcher.console.progress import Progress, ProgressFn, StallDeadline
from launcher.console.relay import LogRelay
from launcher.core.plan import plural
from launcher.core.restart import cause as describe_cause
from launcher.core.result import HostLost, Outcome, RankExit, RankFailed, Signalled, Succeeded, TimedOut
from launcher.diagnose.watch import JobWatch
from launcher.errors import DeadlineReached, HostError, Interrupted
from launcher.job.node import AGENT_MARGIN, HostAttempt, Node, agent_patience
from launcher.job.startup import StartupWatch
from launcher.signals import FORWARDED_SIGNALS, STOP_SIGNALS, Waiter, signal_name, stopping, suspend_self

log = logging.getLogger(__name__)

# After STOP, how long past the grace period we wait for agents before dropping them.
TEARDOWN_SLACK = 5.0


def forward_signal(nodes: Sequence[Node], signum: int) -> None:
    """Have every agent send `signum` to its running ranks (SIGSTOP/SIGCONT also pause its watch)."""
    request = SignalRequest(signal_name(signum))
    for node in nodes:
        node.send(SIGNAL, request)


def probe(
    nodes: Sequence[Node],
    requests: Sequence[ProbeRequest],
    stall: float,
    wake_fd: int,
    progress: ProgressFn | None = None,
    *,
    deadline_at: float | None = None,
    startup: float | None = None,
) -> list[Facts]:
    """Send each agent its preflight question; every agent's answer, in order (one round-trip, in parallel).

    The wait follows progress: it gives up only when no agent at all has answered for `stall` seconds, so
    hundreds of agents starting on busy hosts get the time they need while answers keep coming, and a dead
    host is named `stall` seconds after the last answer. `progress` hears the count after every answer.
    A stopping signal meanwhile raises Interrupted: nothing has started yet, so there is nothing to stop.
    `deadline_at` (time.monotonic()): --timeout's end, which raises DeadlineReached.
    `startup`: --startup-timeout; a host still alive (logging in) is then waited for past the stall time, up
    to that many seconds (launcher.job.startup).
    """
    for node, request in zip(nodes, requests, strict=True):
        node.send(PROBE, request)
    started = time.monotonic()
    deadline = StallDeadline(stall, started)
    watch = StartupWatch(startup, started, stall) if startup else None
    answers: dict[int, Facts] = {}  # by id(node)
    with Waiter[Node](wake_fd) as waiter:

        def on_facts(node: Node, frame: Frame, facts: Facts) -> None:
            answers[id(node)] = facts
            node.probed_at = time.monotonic()
            waiter.unregister(node.link)
            deadline.progressed(time.monotonic())
            if progress is not None:
                progress(Progress("waiting for agents", len(nodes), len(answers)))

        handlers: Handlers = {FACTS: on_facts}
        for node in nodes:
            waiter.register(node.link, node)
        if progress is not None:
            progress(Progress("waiting for agents", len(nodes)))
        while len(answers) < len(nodes):
            now = time.monotonic()
            if deadline_at is not None and now >= deadline_at:
                raise DeadlineReached("--timeout expired while the agents were being probed")
            remaining = deadline.remaining(now)
            missing_nodes = [n for n in nodes if id(n) not in answers]
            if watch is not None and watch.left(now) <= 0:
                raise watch.give_up(missing_nodes[0], now)
            if remaining <= 0:
                silent = [n for n in missing_nodes if watch is None or not watch.alive(n, now)]
                if silent:
                    missing = silent[0]
                    answered = f"; {len(answers)} of {len(nodes)} answered" if len(nodes) > 1 else ""
                    raise HostError(
                        f"host {missing.name}: no answer from the distrun agent within {stall:g}s{answered}",
                        host=missing.name,
                    )
                assert watch is not None
                log.warning("%s", watch.waiting(missing_nodes, len(nodes), now))
                deadline.progressed(now)
                remaining = deadline.remaining(now)
            if watch is not None:
                remaining = min(remaining, watch.left(now))
            if deadline_at is not None:
                remaining = min(remaining, deadline_at - now)
            received, ready = waiter.wait(remaining)
            if stops := stopping(received):
                raise Interrupted.from_signals(stops)
            if signal.SIGTSTP in received:
                # No rank runs yet; the agents only must not take our silence for death.
                forward_signal(nodes, signal.SIGSTOP)
                suspend_self()
                forward_signal(nodes, signal.SIGCONT)
                deadline.progressed(time.monotonic())  # time spent stopped is no agent's fault
            for node in ready:
                frames = node.read()
                if frames is None:
                    detail = node.diagnostics()
                    detail = f": {detail}" if detail else ""
                    raise HostError(
                        f"host {node.name}: the distrun agent exited before answering{detail}", host=node.name
                    )
                for frame in frames:
                    dispatch(handlers, frame, node)
    log.debug(
        "probe: %s answered in %.2fs", plural(len(nodes), "agent", "agents"), time.monotonic() - started
    )
    return [answers[id(node)] for node in nodes]


class Supervisor:
    """The state of one started attempt: what has exited, whether and why it is stopping. `hosts` are the
    attempt's records of its hosts (their `finished` is the Supervisor's to set)."""

    def __init__(
        self,
        hosts: Sequence[HostAttempt],
        relay: LogRelay,
        *,
        timeout: float | None,
        grace: float,
        dead_after: float,
        now: float,
        watch: JobWatch | None = None,
    ) -> None:
        self.hosts = list(hosts)
        # Stacks on request, at the timeout (before stopping) and on a stall; stragglers. None: none of it.
        self.watch = watch
        self._timeout_stacks = False  # the timeout's stacks were asked for
        self.relay = relay
        self.rank_hosts = {slot.rank: host.name for host in hosts for slot in host.slots}
        self.timeout = timeout
        self.deadline = now + timeout if timeout else None
        self.grace = grace
        self.dead_after = dead_after
        for host in self.hosts:
            host.node.beat_gap = 0.0
        self.exits: dict[int, RankExit] = {}
        self.measured: dict[int, RankExited] = {}  # what each rank's agent measured (pid, times, memory)
        self.cause: Outcome | None = None  # why the attempt is stopping; None while it runs
        self.stop_at: float | None = None
        self.killed = False
        self.suspend = False  # Ctrl-Z: the ranks were told to stop; the loop now stops this process
        # The frames an attempt's agents send, by kind (BEAT needs none: any frame counts as word from it).
        self._handlers: Handlers = {
            OUT: self._on_out,
            ERR: self._on_err,
            EXIT: self._on_exit,
            DONE: self._on_done,
            STACK_DUMP: self._on_stacks,
        }

    @property
    def done(self) -> bool:
        return all(host.finished for host in self.hosts)

    def outcome(self) -> Outcome:
        return self.cause or Succeeded()

    # -- stopping

    def _stop(
        self, cause: Callable[[tuple[int, ...]], Outcome], now: float, first: int = signal.SIGTERM
    ) -> None:
        """Stop every host once, for the first cause; `cause` gets the ranks still running."""
        if self.cause is not None:
            return
        self.cause = cause(tuple(sorted(r for r in self.rank_hosts if r not in self.exits)))
        self.stop_at = now
        if self.watch is not None:
            self.watch.stopping()
        log.info("stopping every rank: %s", describe_cause(self.cause))
        self._send_all(STOP, StopRequest(signal_name(first)))

    def _running(self) -> list[Node]:
        return [host.node for host in self.hosts if not host.finished]

    def _send_all(self, kind: int, message: object = None) -> None:
        for node in self._running():
            node.send(kind, message)

    def _kill_now(self) -> None:
        self.killed = True
        self._send_all(KILL)

    # -- events

    def on_signal(self, signum: int, now: float) -> None:
        if signum in FORWARDED_SIGNALS or signum == signal.SIGCONT:
            forward_signal(self._running(), signum)
        elif signum == signal.SIGTSTP:
            # SIGSTOP, not SIGTSTP: each rank leads its own session, so its process group is orphaned, and
            # the kernel ignores SIGTSTP sent to an orphaned group.
            forward_signal(self._running(), signal.SIGSTOP)
            self.suspend = True
        elif signum not in STOP_SIGNALS:
            return
        elif self.cause is None:
            # Ctrl-C reaches the ranks as SIGINT, so `except KeyboardInterrupt:` clean-up runs.
            first = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
            self._stop(lambda stopped: Signalled(signum, stopped), now, first)
            said = f"{signal_name(signum)}: stopping every rank (grace period {self.grace:g}s)"
            if signum == signal.SIGINT:
                said += "; press Ctrl-C again to kill every rank at once"
            self.relay.note([said])
        elif signum == signal.SIGINT and not self.killed:
            # A second Ctrl-C means "now": no more grace period.
            self._kill_now()

    def on_frame(self, host: HostAttempt, frame: Frame, now: float) -> None:
        dispatch(self._handlers, frame, host, now)

    def _on_out(self, host: HostAttempt, now: float, frame: Frame, data: bytes) -> None:
        self.relay.feed(frame.rank, "stdout", data)
        if self.watch is not None:
            self.watch.on_output(frame.rank, data, now)

    def _on_err(self, host: HostAttempt, now: float, frame: Frame, data: bytes) -> None:
        self.relay.feed(frame.rank, "stderr", data)
        if self.watch is not None:
            self.watch.on_output(frame.rank, data, now)

    def _on_stacks(self, host: HostAttempt, now: float, frame: Frame, reply: StackReply) -> None:
        if self.watch is not None:
            self.watch.on_stacks(host, reply, now)
            self._check_timeout(now)

    def _on_exit(self, host: HostAttempt, now: float, frame: Frame, exited: RankExited) -> None:
        rank = frame.rank
        self.measured[rank] = exited
        ended = RankExit(rank, self.rank_hosts.get(rank, host.name), exited.returncode)
        self.exits[rank] = ended
        if exited.returncode != 0:
            self._stop(lambda stopped: RankFailed(ended, stopped), now)

    def _on_done(self, host: HostAttempt, now: float, frame: Frame, _: bytes) -> None:
        host.finished = True

    def on_closed(self, host: HostAttempt, now: float) -> None:
        if not host.finished:
            self._lose(host, host.node.diagnostics() or "connection closed", now)

    def _lose(self, host: HostAttempt, detail: str, now: float) -> None:
        host.drop()
        node = host.node
        # distrun's own silence (it was stopped) outlasted the agent's patience: the agent stopped its ranks.
        waits = agent_patience(self.dead_after)
        ours = node.link.heartbeat and node.beat_gap > waits
        if ours:
            detail = (
                f"distrun itself did not run for {node.beat_gap:.0f}s (was it stopped?), longer than the "
                f"{waits:g}s its agents wait for it (--ssh-keepalive x 5, plus {AGENT_MARGIN:g}s)"
            )
        self._stop(lambda stopped: HostLost(host.name, detail, stopped, ours=ours), now)

    def on_stall(self, seconds: float, now: float) -> None:
        """distrun did not run for `seconds` (stopped, or starved): nobody could be heard meanwhile, so that
        silence is not the hosts'; and the rank output waiting unread was not quiet either."""
        for host in self.hosts:
            host.node.last_heard = max(host.node.last_heard, now)
        self.relay.stalled(seconds)

    def _check_timeout(self, now: float) -> None:
        if self.deadline is None or now < self.deadline or self.cause is not None:
            return
        if self.watch is not None:
            # Every rank's stacks first: where a job that ran out of time was is what its user asks next.
            if not self._timeout_stacks:
                self._timeout_stacks = True
                self.watch.request("timeout", now)
            if self.watch.gathering("timeout"):
                return
        timeout = self.timeout or 0.0
        self._stop(lambda stopped: TimedOut(timeout, stopped), now)

    def on_tick(self, now: float) -> None:
        if self.watch is not None:
            self.watch.tick(now)
        self._check_timeout(now)
        for host in self.hosts:
            node = host.node
            # Local agents need no heartbeat: a dead one closes its pipe, which the loop sees at once.
            if not host.finished and node.link.heartbeat and now - node.last_heard > self.dead_after:
                self._lose(host, f"no word from it for {now - node.last_heard:.0f}s", now)
        if self.stop_at is not None and now - self.stop_at > self.grace + TEARDOWN_SLACK:
            for host in self.hosts:
                if not host.finished:
                    log.warning("host %s: agent did not finish stopping its ranks; dropping it", host.name)
                    host.drop()

    def until_deadline(self, now: float) -> float | None:
        """Seconds until the timeout fires (None: no timeout pending)."""
        if self.deadline is None or self.cause is not None or self._timeout_stacks:
            return None
        return max(0.0, self.deadline - now)


def supervise(sup: Supervisor, wake_fd: int, check_every: float) -> Outcome:
    """Run the started attempt to its end: wait for events and hand them to `sup`."""
    now = time.monotonic()
    next_check = now + check_every
    for host in sup.hosts:
        host.node.last_heard = max(host.node.last_heard, now)  # we were not listening before the attempt
    with Waiter[HostAttempt | str](wake_fd) as waiter:
        control = sup.watch.control if sup.watch is not None else None
        if control is not None:
            waiter.register(control, "control")
        for host in sup.hosts:
            if not host.finished:
                waiter.register(host.link, host)
        while not sup.done:
            wait = next_check - now
            until = sup.until_deadline(now)
            if until is not None:
                wait = min(wait, until)
            relay_due = sup.relay.next_deadline()  # a partial line's quiet spell, a held-back redraw
            watch_due = sup.watch.next_deadline() if sup.watch is not None else None
            for due in (relay_due, watch_due):
                if due is not None:
                    wait = min(wait, due - now)
            before = time.monotonic()
            received, ready = waiter.wait(max(0.0, wait))
            selected = time.monotonic()
            overslept = selected - before - max(0.0, wait)
            if overslept > check_every:
                # Our clock jumped past the wait: this process was stopped (SIGSTOP) or starved meanwhile.
                sup.on_stall(overslept, selected)
            for signum in received:
                sup.on_signal(signum, selected)
            for source in ready:
                if isinstance(source, str):
                    if sup.watch is not None:
                        sup.watch.on_control()
                    continue
                frames = source.node.read()
                if frames is None:
                    waiter.unregister(source.link)
                    sup.on_closed(source, selected)
                    continue
                for frame in frames:
                    sup.on_frame(source, frame, selected)
                if source.finished:
                    waiter.unregister(source.link)
            sup.relay.tick(time.monotonic())
            if sup.suspend:
                sup.suspend = False
                suspend_self()
            now = time.monotonic()
            if now - selected > check_every:
                # Our own loop was stuck (a console that does not read): nobody could be heard meanwhile. (The
                # heartbeat thread went on, so the agents heard us; the relay counts its own wait.)
                for host in sup.hosts:
                    host.node.last_heard = max(host.node.last_heard, now)
            due = now >= next_check or (sup.deadline is not None and now >= sup.deadline)
            if due or (watch_due is not None and now >= watch_due):
                next_check = now + check_every
                sup.on_tick(now)
    return sup.outcome()
