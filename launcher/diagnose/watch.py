"""Seeing inside a running attempt: every rank's stacks on request, at the timeout and on a stall; stragglers.

`JobWatch` lives as long as the job; the supervisor feeds it output, STACK_DUMP frames and the clock. A
gathering asks every host's agent at once and ends when all have answered or after a bounded wait, so one
slow host holds the others' stacks back by at most that long; its ranks are then named as unread.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.agent.protocol import STACKS
from launcher.console.relay import LogRelay, first_stacks_number
from launcher.core.plan import plural
from launcher.core.scrub import SCRUBBER
from launcher.core.timeline import Timeline, slowest
from launcher.diagnose.isolation import Isolation, describe
from launcher.diagnose.live import LiveView, World, host_lines
from launcher.diagnose.stragglers import Straggler, StragglerWatch
from launcher.runtime.control import ControlError, ControlServer, answer, answer_busy
from launcher.runtime.node import HostAttempt

if TYPE_CHECKING:  # stack dumps load at the first gathering, not on every job's start-up
    from launcher.agent.sample_messages import Samples
    from launcher.agent.stack_messages import StackReply
    from launcher.core.config import LaunchConfig
    from launcher.core.samples import Point
    from launcher.diagnose.stacks import RankStacks, StackDump

log = logging.getLogger(__name__)

# What an agent may take beyond the ranks' own wait before its host counts as not answering.
AGENT_SLACK = 2.0
TOP = "distrun top's live view"


def open_control() -> ControlServer | None:
    """The job's control socket; without one the job runs on, only `distrun stacks` cannot reach it."""
    try:
        return ControlServer()
    except (OSError, ControlError) as err:
        log.warning("no control socket for distrun stacks: %s", err)
        return None


@dataclass(frozen=True)
class WatchOptions:
    """How the job is watched: the stack tool and its wait, stall and straggler limits, samples."""

    tool: str = "auto"  # --stack-tool: auto, py-spy, python
    wait: float = 15.0  # per rank, on its host (py-spy's native frames of a torch rank take seconds)
    stall_timeout: float | None = None
    straggler_window: float = 60.0
    output_dir: Path | None = None
    sample_interval: float = 2.0  # --sample-interval: the agents' pace (0: no samples)

    @classmethod
    def of(cls, config: LaunchConfig) -> WatchOptions:
        return cls(
            sample_interval=config.sample_interval,
            tool=config.stack_tool,
            stall_timeout=config.stall_timeout,
            straggler_window=config.straggler_window,
            output_dir=config.output_dir,
        )


@dataclass
class _Gathering:
    """One request for the ranks' stacks while the hosts' answers come in."""

    request_id: int
    reason: str
    hosts: list[HostAttempt]
    deadline: float
    stacks: list[RankStacks] = field(default_factory=list)
    waiting: set[str] = field(default_factory=set)
    clients: list[socket.socket] = field(default_factory=list)


class JobWatch:
    """The job's eyes: gatherings of stacks (one at a time; requests meanwhile join it), the stall
    watchdog, the straggler watch and the start-up timeline, with what they found for the report. None of
    them can end the job: each runs behind `isolation`'s guard where the job calls it."""

    def __init__(self, relay: LogRelay, options: WatchOptions, control: ControlServer | None = None) -> None:
        self.relay = relay
        self.options = options
        self.isolation = Isolation()
        self.control = control
        self.dumps: list[StackDump] = []
        self.stragglers = StragglerWatch({}, options.straggler_window)
        self.named: list[Straggler] = []
        self._pending: _Gathering | None = None
        self._next_id = 1
        self._last_output = time.monotonic()
        self._stall_shown = False
        self._stopping = False  # the attempt is being stopped: its silence is no stall
        self._hosts_now: list[HostAttempt] = []  # the running attempt's hosts
        self._hosts: dict[int, str] = {}
        # An elastic job's world as it is now (its ranks, (rank id, host) in rank order, and those that left):
        # after a reset in place, the ranks that left are not named as unread in the stacks, nor counted, and
        # `distrun top` marks them. None: the attempt's slots are the world.
        self.world: Callable[[], World] | None = None
        self.timeline = Timeline(time.monotonic())
        self._timeline_told = False
        # `distrun top`, the console's host lines, the report's samples; answered in every phase.
        self.live = LiveView(self.timeline.start)
        if control is not None:
            control.top = self.answer_top
        # An earlier run's stacks files in a reused --output-dir stay; this job's are numbered after them.
        self._first_file = first_stacks_number(options.output_dir)

    def close(self) -> None:
        if self.control is not None:
            self.control.close()

    # -- the attempt

    def attempt_started(
        self, hosts: Sequence[HostAttempt], now: float, world: Callable[[], World] | None = None
    ) -> None:
        """`world`: an elastic attempt's world now, which its resets change."""
        self.world = world
        self._hosts_now = list(hosts)
        self._last_output = now
        self._stall_shown = False
        self._stopping = False
        self._hosts = {slot.rank: host.name for host in hosts for slot in host.slots}
        self.stragglers = StragglerWatch(self._hosts, self.options.straggler_window)
        with self.isolation.guard(TOP):
            self.live.attempt_started(self._hosts, now, self.options.sample_interval, world)

    def attempt_ended(self) -> None:
        """Whatever was still being gathered is answered with what came (the attempt is over)."""
        if self._pending is not None:
            self._finish(time.monotonic())
        with self.isolation.guard("the start-up timeline"):
            self._tell_timeline()
        self.named.extend(self.stragglers.named)
        self._hosts_now = []
        self.relay.show_hosts([])  # the host lines go with the attempt

    # -- events

    def stopping(self) -> None:
        self._stopping = True

    def on_output(self, rank: int, data: bytes, now: float) -> None:
        self._last_output = now
        self._stall_shown = False
        with self.isolation.guard("the straggler watch"):
            self.stragglers.seen(rank, data, now)
        with self.isolation.guard(TOP):
            self.live.on_output(rank, data, now)
        with self.isolation.guard("the start-up timeline"):
            first = not self._timeline_told and self.timeline.wrote(rank, self._hosts.get(rank, "?"), now)
            if first and sum(len(h.first_output) for h in self.timeline.hosts.values()) >= len(self._hosts):
                self._tell_timeline()

    def on_exit(self, rank: int, returncode: int) -> None:
        with self.isolation.guard(TOP):
            self.live.on_exit(rank, returncode)

    def on_samples(self, samples: Samples, now: float, host: str = "") -> None:
        if samples.error:  # the agent's sampling failed this time: its ranks keep their last samples
            self.isolation.say(f"{TOP} on host {host or '?'}: {samples.error}")
        with self.isolation.guard(TOP):
            self.live.on_samples(samples, now, self.stragglers)
            if self.relay.terminal:  # the status area's line per host; off a terminal nothing changes
                self.relay.show_hosts(host_lines(self.live.rows(now, self.stragglers)))

    def answer_top(self, doing: str) -> str:
        """`distrun top`'s answer, whatever the job is doing (`doing`, as the running phase says it); where
        the live view fails, what the job is doing and the error."""
        try:
            return self.live.answer(doing, time.monotonic(), self.stragglers)
        except Exception as err:  # the boundary of `distrun top` (launcher.diagnose.isolation)
            failure = self.isolation.failed(TOP, err)
        return json.dumps({"pid": os.getpid(), "doing": doing, "ranks": [], "error": failure}) + "\n"

    def samples_of_attempt(self) -> dict[int, list[Point]] | None:
        """Each rank's samples over the attempt, for the report (None where reading them failed)."""
        with self.isolation.guard("the report's samples"):
            return self.live.samples_of_attempt()
        return None

    def _tell_timeline(self) -> None:
        """-v: the slowest host of each start-up phase, once every rank wrote (or the attempt ended)."""
        if not self._timeline_told:
            self._timeline_told = True
            for line in slowest(self.timeline.hosts.values()):
                log.info("%s", line)

    def on_stacks(self, host: HostAttempt, reply: StackReply, now: float) -> None:
        pending = self._pending
        if pending is None or reply.request_id != pending.request_id or host.name not in pending.waiting:
            return
        from launcher.diagnose.stacks import RankStacks

        pending.waiting.discard(host.name)
        read: list[RankStacks] = []
        garbled = ""
        for data in reply.ranks if isinstance(reply.ranks, list) else []:
            try:
                read.append(RankStacks.from_json(host.name, data))
            except Exception as err:  # the boundary of an agent's answer (launcher.diagnose.isolation)
                garbled = f"its agent's answer could not be read: {describe(err)}"
                self.isolation.failed(f"distrun stacks (host {host.name}'s answer)", err)
        answered = {r.rank for r in read}
        pending.stacks.extend(read)
        pending.stacks.extend(
            RankStacks(rank, host.name, error=garbled or "it has exited")
            for rank in self._ranks_of(host)
            if rank not in answered
        )
        if not pending.waiting:
            self._finish(now)

    def ask(self, conn: socket.socket, now: float) -> None:
        """`distrun stacks` asks while ranks run (the job's loop answers every other phase itself)."""
        if not self._hosts_now:
            answer_busy(conn, "starting its ranks")
            return
        self.request("request", now, conn)

    def tick(self, now: float) -> None:
        if self._pending is not None and now >= self._pending.deadline:
            self._finish(now)
        stall = self.options.stall_timeout or 0.0
        if self._stall_due() and now - self._last_output >= stall:
            self._stall_shown = True  # once per stall: the next output starts a new watch
            self.relay.note(
                [f"no rank has written anything for {stall:g}s: a stall? gathering every rank's stacks"]
            )
            self.request("stall", now)
        with self.isolation.guard("the straggler watch"):
            for straggler in self.stragglers.check(now):
                self.relay.note([f"straggler: {straggler.text()}"])

    def next_deadline(self) -> float | None:
        due = [self._pending.deadline] if self._pending is not None else []
        if self._stall_due():
            due.append(self._last_output + (self.options.stall_timeout or 0.0))
        return min(due) if due else None

    def _stall_due(self) -> bool:
        watching = self.options.stall_timeout and self._hosts_now
        return bool(watching and not self._stall_shown and not self._stopping)

    # -- gathering

    def request(self, reason: str, now: float, client: socket.socket | None = None) -> None:
        """Gather every rank's stacks (joining a gathering under way, whose reason a timeout overrides);
        where asking fails, `client` is told why and the job runs on (a timeout then stops at once)."""
        try:
            self._request(reason, now, client)
        except Exception as err:  # the boundary of asking for stacks (launcher.diagnose.isolation)
            failure = self.isolation.failed("distrun stacks", err)
            if client is not None and (self._pending is None or client not in self._pending.clients):
                answer(client, failure + "\n")

    def _request(self, reason: str, now: float, client: socket.socket | None) -> None:
        if self._pending is None:
            hosts = [h for h in self._hosts_now if not h.finished]
            wait = self.options.wait
            pending = _Gathering(self._next_id, reason, hosts, now + wait + AGENT_SLACK)
            self._next_id += 1
            from launcher.agent.stack_messages import StacksRequest  # only once stacks are asked for

            request = StacksRequest(pending.request_id, self.options.tool, wait)
            for host in hosts:
                pending.waiting.add(host.name)
                host.node.send(STACKS, request)
            self._pending = pending
        elif reason == "timeout":
            self._pending.reason = reason
        if client is not None:
            self._pending.clients.append(client)
        if not self._pending.waiting:
            self._finish(now)

    def gathering(self, reason: str) -> bool:
        return self._pending is not None and self._pending.reason == reason

    def _finish(self, now: float) -> None:
        from launcher.diagnose.raw_dump import gathered
        from launcher.diagnose.stacks import RankStacks

        pending, self._pending = self._pending, None
        assert pending is not None
        for host in pending.hosts:
            if host.name in pending.waiting:
                reason = f"its host's agent did not answer within {self.options.wait + AGENT_SLACK:g}s"
                pending.stacks.extend(RankStacks(r, host.name, error=reason) for r in self._ranks_of(host))
        world = sum(len(self._ranks_of(h)) for h in self._hosts_now) or len(pending.stacks)
        dump, body, full = gathered(pending.reason, time.time(), world, pending.stacks, self.isolation)
        self.dumps.append(dump)
        hosts = len({s.host for s in pending.stacks})
        head = f"stacks of {plural(len(pending.stacks), 'rank', 'ranks')} on {plural(hosts, 'host', 'hosts')}"
        if pending.reason != "request":
            self.relay.note([f"{head} ({pending.reason}):"])
            self.relay.block(body)
        # The file keeps every frame as read; the console and `distrun stacks` get the readable form.
        path = self._write(dump, [head + ":", *full])
        text = "\n".join([head + ":", *body, *([f"written to {path}"] if path else [])]) + "\n"
        for client in pending.clients:
            answer(client, SCRUBBER(text))

    def _ranks_of(self, host: HostAttempt) -> list[int]:
        """The ranks of the world on `host` now."""
        if self.world is None:
            return [slot.rank for slot in host.slots]
        return [rank for rank, name in self.world()[0] if name == host.name]

    def _write(self, dump: StackDump, lines: list[str]) -> Path | None:
        if self.options.output_dir is None:
            return None
        path = self.options.output_dir / f"stacks-{self._first_file + len(self.dumps) - 1}-{dump.reason}.txt"
        try:
            path.write_text(SCRUBBER("\n".join(lines) + "\n"), encoding="utf-8")
        except OSError as err:
            log.warning("cannot write %s: %s", path, err.strerror or err)
            return None
        return path
