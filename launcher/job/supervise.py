"""Watch one started attempt of the job: every host's agent until the attempt ends.

A phase of the job's loop (launcher.runtime.loop). `Supervisor` is the attempt's state, fed events
(frames, a closed link, a signal, the clock) and deciding what to send; `supervise` runs it on the loop. Tests
drive a Supervisor directly with fake links. The first failure, a signal, the timeout or a lost host stops
every host.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from launcher.agent.protocol import (
    DONE,
    ERR,
    EXIT,
    KILL,
    OPTED_IN,
    OUT,
    RANK_READY,
    RANK_SYNCED,
    SAMPLES,
    STACK_DUMP,
    STOP,
    Frame,
    RankExited,
    StopRequest,
    dispatch,
)
from launcher.console.relay import LogRelay
from launcher.core.restart import cause as describe_cause
from launcher.core.result import HostLost, Outcome, RankExit, RankFailed, Signalled, Succeeded
from launcher.diagnose.watch import JobWatch
from launcher.errors import signal_name
from launcher.runtime.control import answer_busy
from launcher.runtime.loop import NO_DEADLINE, Deadline, Loop, Phase, forward_signal
from launcher.runtime.node import AGENT_MARGIN, HostAttempt, Node, agent_patience
from launcher.signals import FORWARDED_SIGNALS, STOP_SIGNALS, suspend_self

if TYPE_CHECKING:  # an elastic job's, stacks' and samples' types: loaded where those happen, not at start-up
    from launcher.agent.elastic_messages import RankSynced, Ready
    from launcher.agent.sample_messages import Samples
    from launcher.agent.stack_messages import StackReply
    from launcher.job.elastic import Resetter
    from launcher.job.host_watch import HostWatch

log = logging.getLogger(__name__)

# After STOP, how long past the grace period we wait for agents before dropping them.
TEARDOWN_SLACK = 5.0


class Supervisor(Phase[HostAttempt]):
    """The state of one started attempt: what has exited, whether and why it is stopping. `hosts` are the
    attempt's records of its hosts (their `finished` is the Supervisor's to set). The running attempt's phase
    of the job's loop: a signal, the timeout or a lost host stop every rank rather than raise."""

    def __init__(
        self,
        hosts: Sequence[HostAttempt],
        relay: LogRelay,
        *,
        deadline: Deadline = NO_DEADLINE,
        grace: float,
        dead_after: float,
        watch: JobWatch | None = None,
        elastic: Resetter | None = None,
        host_watch: HostWatch | None = None,
    ) -> None:
        """`deadline`: the job's (its Loop's), when the attempt is stopped and the job ends as timed out.
        `elastic`: an elastic job's driver, which keeps the survivors running where every rank opted in;
        `host_watch`: its --host-discovery-script, polled while the ranks run."""
        super().__init__([(host.node, host) for host in hosts], dead_after)
        self.hosts = list(hosts)
        # Stacks on request, at the timeout (before stopping) and on a stall; stragglers. None: none of it.
        self.watch = watch
        self._timeout_stacks = False  # the timeout's stacks were asked for
        self.elastic = elastic
        self.host_watch = host_watch
        self.relay = relay
        self.rank_hosts = {slot.rank: host.name for host in hosts for slot in host.slots}
        if elastic is not None:
            self.rank_hosts = elastic.host_of  # one map: a reset's newcomers are the attempt's ranks too
            elastic.on_stop = self._round_stopped
        # The round's first loss, the attempt's outcome should the round decide that it stops.
        self.first_loss: Callable[[tuple[int, ...]], Outcome] | None = None
        self.deadline = deadline
        self.grace = grace
        for host in self.hosts:
            host.node.attempt_began()
        self.exits: dict[int, RankExit] = {}
        self.measured: dict[int, RankExited] = {}  # what each rank's agent measured (pid, times, memory)
        self.cause: Outcome | None = None  # why the attempt is stopping; None while it runs
        self.stop_at: float | None = None
        self.killed = False
        self.suspend = False  # Ctrl-Z: the ranks were told to stop; the loop now stops this process
        # The frames an attempt's agents send, by kind (BEAT needs none: any frame counts as word from it).
        self.handlers = {
            OUT: self._on_out,
            ERR: self._on_err,
            EXIT: self._on_exit,
            DONE: self._on_done,
            STACK_DUMP: self._on_stacks,
            SAMPLES: self._on_samples,
            OPTED_IN: self._on_opted_in,
            RANK_READY: self._on_ready,
            RANK_SYNCED: self._on_synced,
        }

    @property
    def done(self) -> bool:
        return all(host.finished or host.idle for host in self.hosts)

    def listening(self, context: HostAttempt) -> bool:
        return not context.finished

    def doing(self, now: float) -> str:
        if self.cause is not None:
            return "stopping its ranks"
        return self.elastic.doing() if self.elastic is not None else "running its ranks"

    def next_due(self) -> float | None:
        due = self.watch.next_deadline() if self.watch is not None else None
        if self.host_watch is not None and self.cause is None:
            polled = self.host_watch.next_due()
            due = polled if due is None else min(due, polled)
        return due

    def end_job(self, now: float) -> None:
        """Stop every rank for a reason of the job's own: the host watch's error, raised once they stopped."""
        self._stop(lambda stopped: Signalled(signal.SIGTERM, stopped), now)

    def add_host(self, host: HostAttempt) -> None:
        """A host the discovery script added while the attempt runs (its ranks come with the next reset)."""
        self.hosts.append(host)
        host.node.attempt_began()
        # A host back from its cooldown: its old record is read no more (the loop reads a node for one
        # record), and its silence since its ranks ended was ours, not the host's.
        self.sources = [(node, record) for node, record in self.sources if node is not host.node]
        host.node.excuse(time.monotonic())
        self.add_source(host.node, host)

    def next_wake(self) -> float | None:
        return self.relay.next_deadline()  # a partial line's quiet spell, a held-back redraw

    def outcome(self) -> Outcome:
        cause = self.cause
        if cause is None or isinstance(cause, Succeeded):
            return Succeeded()
        # The stop began with the ranks whose exits had not yet arrived; those whose agent says they ended
        # before its stop reached them were not stopped, and are named with their own exits instead.
        own = tuple(
            self.exits[r]
            for r in cause.stopped
            if r in self.measured and _exited_on_its_own(self.measured[r])
        )
        if not own:
            return cause
        ended = {e.rank for e in own}
        stopped = tuple(r for r in cause.stopped if r not in ended)
        if isinstance(cause, RankFailed):
            return dataclasses.replace(cause, stopped=stopped, exited=own)
        return dataclasses.replace(cause, stopped=stopped)

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

    def on_signals(self, received: bytes, now: float) -> None:
        for signum in received:
            self.on_signal(signum, now)

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
        dispatch(self.handlers, frame, host, now)

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

    def _on_samples(self, host: HostAttempt, now: float, frame: Frame, samples: Samples) -> None:
        if self.watch is not None:
            self.watch.on_samples(samples, now, host.name)

    def _on_exit(self, host: HostAttempt, now: float, frame: Frame, exited: RankExited) -> None:
        rank = frame.rank
        if self.watch is not None:
            self.watch.on_exit(rank, exited.returncode)
        self.measured[rank] = exited
        ended = RankExit(rank, self.rank_hosts.get(rank, host.name), exited.returncode)
        self.exits[rank] = ended
        if exited.returncode == 0:
            if self.elastic is not None and self.cause is None:
                self.elastic.succeeded(rank, now)
            return
        done = sum(1 for other in self.exits.values() if other.rank != rank and other.returncode == 0)

        def failed(stopped: tuple[int, ...]) -> Outcome:
            return RankFailed(ended, stopped, peers_done=done)

        if self.first_loss is None or self.elastic is None or not self.elastic.resetting:
            self.first_loss = failed
        if not self._absorbed([rank], describe_cause(RankFailed(ended)), now):
            self._stop(failed, now)

    def _round_stopped(self, reason: str, now: float) -> None:
        """The round decided that the attempt stops (launcher.core.elastic_policy): its first loss is the
        outcome."""
        if self.cause is not None:
            return
        self.relay.note([f"no reset in place: {reason}"])
        # A planned reset's round has no loss: a rank that finished meanwhile ended the work (Horovod's first
        # rule), and the others are stopped at their commit.
        self._stop(self.first_loss or (lambda stopped: Succeeded()), now)

    def _absorbed(self, ranks: list[int], why: str, now: float) -> bool:
        """An elastic job's survivors go on in a smaller world (a reset in place) where they can."""
        if self.elastic is None or self.cause is not None:
            return False
        if self.elastic.absorb(ranks, why, now):
            return True
        if self.elastic.refused is not None and self.elastic.opted:
            # Said only where some rank opted in: a job that never used hvd.elastic restarts as it always did.
            self.relay.note([f"no reset in place: {self.elastic.refused}"])
        return False

    def _on_opted_in(self, host: HostAttempt, now: float, frame: Frame, _: bytes) -> None:
        if self.elastic is not None:
            self.elastic.opted_in(frame.rank)

    def _on_ready(self, host: HostAttempt, now: float, frame: Frame, ready: Ready) -> None:
        if self.elastic is not None:
            self.elastic.ready(frame.rank, ready.port, now)

    def _on_synced(self, host: HostAttempt, now: float, frame: Frame, synced: RankSynced) -> None:
        # Once the attempt stops (--timeout, a signal), a rank that the stop woke from its reset may still
        # report it: the reset did not complete.
        if self.elastic is not None and self.cause is None:
            self.elastic.synced(frame.rank, synced.seconds, now)

    def _on_done(self, host: HostAttempt, now: float, frame: Frame, _: bytes) -> None:
        # A connection's frames come in order: the EXIT of every rank this DONE ends was read before it. A
        # rank sent there that has not exited came after it (a reset's newcomer sent as the agent ended its
        # attempt), and the agent runs it in a new attempt: the host is not done.
        if any(rank not in self.exits for rank in host.sent):
            return
        host.finished = True

    def on_closed(self, host: HostAttempt, now: float) -> None:
        if not host.finished:
            self._lose(host, host.node.diagnostics() or "connection closed", now)

    def _lose(self, host: HostAttempt, detail: str, now: float) -> None:
        host.drop()
        if host.idle:  # a spare without a rank: the attempt goes on, the spare is left out
            if self.elastic is not None:
                self.elastic.spare_lost(host.name, detail)
            return
        node = host.node
        # distrun's own silence (it was stopped) outlasted the agent's patience: the agent stopped its ranks.
        waits = agent_patience(self.dead_after)
        ours = node.we_were_silent(waits)
        if ours:
            detail = (
                f"distrun itself did not run for {node.beat_gap:.0f}s (was it stopped?), longer than the "
                f"{waits:g}s its agents wait for it (--ssh-keepalive x 5, plus {AGENT_MARGIN:g}s); they wait "
                "however long only for a distrun on a terminal or one stopped with Ctrl-Z"
            )
        lost = [r for r, name in self.rank_hosts.items() if name == host.name and r not in self.exits]

        def gone(stopped: tuple[int, ...]) -> Outcome:
            return HostLost(host.name, detail, stopped, ours=ours)

        if self.first_loss is None or self.elastic is None or not self.elastic.resetting:
            self.first_loss = gone
        if not ours and self._absorbed(lost, f"lost host {host.name} ({detail})", now):
            return
        self._stop(gone, now)

    def on_silent(self, host: HostAttempt, seconds: float, now: float) -> None:
        self._lose(host, f"no word from it for {seconds:.0f}s", now)

    def on_stall(self, seconds: float, now: float) -> None:
        """distrun did not run for `seconds` (stopped, or starved): the rank output waiting unread was not
        quiet either (the loop excused the hosts' silence)."""
        self.relay.stalled(seconds)

    def on_control(self, conn: socket.socket, now: float) -> None:
        if self.watch is None:
            answer_busy(conn, self.doing(now))
        else:
            self.watch.ask(conn, now)

    def on_deadline(self, now: float, deadline: Deadline) -> None:
        self._check_timeout(now)

    def after_events(self, now: float) -> None:
        self.relay.tick(now)
        if self.suspend:
            self.suspend = False
            suspend_self()

    def _check_timeout(self, now: float) -> None:
        if not self.deadline.passed(now) or self.cause is not None:
            return
        if self.watch is not None:
            # Every rank's stacks first: where a job that ran out of time was is what its user asks next.
            if not self._timeout_stacks:
                self._timeout_stacks = True
                self.watch.request("timeout", now)
            if self.watch.gathering("timeout"):
                return
        self._stop(self.deadline.outcome, now)

    def on_tick(self, now: float) -> None:
        if self.watch is not None:
            self.watch.tick(now)
        if self.host_watch is not None and self.cause is None:
            self.host_watch.tick(now)
        self._check_timeout(now)
        # Local agents need no heartbeat: a dead one closes its pipe, which the loop sees at once.
        self.check_liveness(now)
        if self.stop_at is not None and now - self.stop_at > self.grace + TEARDOWN_SLACK:
            for host in self.hosts:
                if not host.finished:
                    log.warning("host %s: agent did not finish stopping its ranks; dropping it", host.name)
                    host.drop()

    def until_deadline(self, now: float) -> float | None:
        """Seconds until the timeout fires (None: no timeout pending)."""
        left = self.deadline.left(now)
        if left is None or self.cause is not None or self._timeout_stacks:
            return None
        return max(0.0, left)


def supervise(sup: Supervisor, wake_fd: int | Loop, check_every: float = 1.0) -> Outcome:
    """Run the started attempt to its end on the job's loop (or, given a signal pipe's fd, on a loop of its
    own)."""
    if isinstance(wake_fd, Loop):
        loop = wake_fd
    else:
        control = sup.watch.control if sup.watch is not None else None
        loop = Loop(wake_fd, deadline=sup.deadline, check_every=check_every, control=control)
    loop.run(sup)
    return sup.outcome()


def _exited_on_its_own(exited: RankExited) -> bool:
    """The stop did not reach it (its agent says), or it exited with a code of its own rather than die of the
    stop's signal: a rank already on its way out when the SIGTERM came is named with its exit, not as
    stopped."""
    return exited.stopped is False or exited.returncode >= 0
