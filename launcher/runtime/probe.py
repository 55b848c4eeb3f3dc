"""The probe: every agent's FACTS (host facts, free ports), asked in one round-trip, as a phase of the loop.

The wait follows progress (a `StallDeadline`), so hundreds of agents starting on busy hosts get the time they
need while answers keep coming, and a dead host is named `stall` seconds after the last answer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence

from launcher.agent.protocol import FACTS, PROBE, Facts, Frame, ProbeRequest
from launcher.core.plan import plural
from launcher.core.progress import Progress, ProgressFn, StallDeadline
from launcher.errors import CommandNotFound, HostError
from launcher.runtime.loop import Loop, Phase
from launcher.runtime.node import HostAttempt, Node
from launcher.runtime.startup import StartupWatch

log = logging.getLogger(__name__)


def probe_requests(
    hosts: Sequence[HostAttempt],
    *,
    route_to: str,
    python: str,
    cwd: str | None,
    script: str | None,
    heartbeat: float,
    dead_after: float,
    wait_while_stopped: bool = False,
    software: bool | None = None,
) -> list[ProbeRequest]:
    """Each host's question for an attempt (node-rank order). `cwd`/`script`: checked there, unless None
    (ranks run in a synced copy, checked here); `heartbeat`/`dead_after`: the agent's pace and patience;
    `wait_while_stopped`: distrun is a terminal's job, which its agents wait for while it is stopped;
    `software`: ask for software versions (None: only where there is more than one host to compare them,
    True for hosts joining a running job, whose versions are compared with the others')."""
    compare = len(hosts) > 1 if software is None else software
    return [
        ProbeRequest(
            # Rank 0's host also probes two rendezvous ports: one differs from the last attempt's.
            ports=len(host.slots) + (2 if i == 0 else 0),
            cwd=cwd or "",
            route_to=route_to,
            python=python,
            # A local agent needs no heartbeats: its pipe closing says all.
            heartbeat=heartbeat if host.link.heartbeat else 0.0,
            dead_after=dead_after if host.link.heartbeat else 0.0,
            wait_while_stopped=wait_while_stopped,
            script=script,
            # One host has nothing to differ from: the launch of a lone host skips the interpreter run.
            software=compare,
        )
        for i, host in enumerate(hosts)
    ]


class ProbePhase(Phase[Node]):
    """Waiting for every agent's FACTS. The wait follows progress: it gives up only when no agent at all has
    answered for `stall` seconds, or, given `startup` (--startup-timeout), once no host still starting is
    alive (see `probe`)."""

    def __init__(
        self,
        nodes: Sequence[Node],
        stall: float,
        progress: ProgressFn | None,
        startup: float | None = None,
        joining: bool = False,
    ) -> None:
        # No liveness by heartbeat here: the stall deadline names a silent host.
        super().__init__([(node, node) for node in nodes], dead_after=float("inf"))
        self.nodes = list(nodes)
        self.stall = stall
        self.progress = progress
        self.began = time.monotonic()
        self.deadline = StallDeadline(stall, self.began)
        self.startup = StartupWatch(startup, self.began, stall) if startup else None
        self.answers: dict[int, Facts] = {}  # by id(node)
        self.answered_at: dict[str, float] = {}  # when each host's agent answered
        self.handlers = {FACTS: self._on_facts}
        self.busy_briefly = joining  # hosts joining a running attempt: its ranks run meanwhile

    @property
    def done(self) -> bool:
        return len(self.answers) == len(self.nodes)

    def listening(self, context: Node) -> bool:
        return id(context) not in self.answers

    def doing(self, now: float) -> str:
        answered = f" ({len(self.answers)} of {len(self.nodes)} answered)" if len(self.nodes) > 1 else ""
        if self.busy_briefly:
            names = ", ".join(node.name for node in self.nodes)
            return f"adding {names}: waiting for the agents' answers{answered}"
        return f"starting: waiting for the agents' answers{answered}"

    def next_due(self) -> float | None:
        if self.startup is None:
            return self.deadline.at
        return min(self.deadline.at, self.startup.started + self.startup.limit)

    def _on_facts(self, node: Node, now: float, frame: Frame, facts: Facts) -> None:
        self.answers[id(node)] = facts
        self.answered_at[node.name] = now
        self.deadline.progressed(now)
        if self.progress is not None:
            self.progress(Progress("waiting for agents", len(self.nodes), len(self.answers)))

    def on_tick(self, now: float) -> None:
        missing = [n for n in self.nodes if id(n) not in self.answers]
        if self.startup is not None and self.startup.left(now) <= 0:
            raise self.startup.give_up(missing[0], now)
        if self.deadline.remaining(now) <= 0:
            silent = [n for n in missing if self.startup is None or not self.startup.alive(n, now)]
            if silent:
                name, total = silent[0].name, len(self.nodes)
                answered = f"; {len(self.answers)} of {total} answered" if total > 1 else ""
                raise HostError(
                    f"host {name}: no answer from the distrun agent within {self.stall:g}s{answered}",
                    host=name,
                )
            assert self.startup is not None
            log.warning("%s", self.startup.waiting(missing, len(self.nodes), now))
            self.deadline.progressed(now)

    def on_closed(self, node: Node, now: float) -> None:
        detail = node.diagnostics()
        detail = f": {detail}" if detail else ""
        raise HostError(
            f"host {node.name}: the distrun agent exited before answering{detail}", host=node.name
        )

    def on_stall(self, seconds: float, now: float) -> None:
        self.deadline.progressed(now)  # time spent stopped is no agent's fault


def probe(
    nodes: Sequence[Node],
    requests: Sequence[ProbeRequest],
    stall: float,
    wake_fd: int | Loop,
    progress: ProgressFn | None = None,
    *,
    startup: float | None = None,
) -> list[Facts]:
    """Send each agent its preflight question; every agent's answer, in order (one round-trip, in parallel).

    The wait follows progress: it gives up only when no agent at all has answered for `stall` seconds, so
    hundreds of agents starting on busy hosts get the time they need while answers keep coming, and a dead
    host is named `stall` seconds after the last answer. `progress` hears the count after every answer.
    A stopping signal meanwhile raises Interrupted: nothing has started yet, so there is nothing to stop.
    `wake_fd`: the job's Loop (its deadline raises DeadlineReached), or a signal pipe's fd for a loop of its
    own without one.
    `startup`: --startup-timeout; a host still alive (logging in) is then waited for past the stall time, up
    to that many seconds (launcher.runtime.startup).
    """
    loop = wake_fd if isinstance(wake_fd, Loop) else Loop(wake_fd, check_every=1.0)
    return probe_on(loop, nodes, requests, stall, progress, startup=startup)[0]


def probe_on(
    loop: Loop,
    nodes: Sequence[Node],
    requests: Sequence[ProbeRequest],
    stall: float,
    progress: ProgressFn | None = None,
    *,
    startup: float | None = None,
    joining: bool = False,
) -> tuple[list[Facts], dict[str, float]]:
    """`probe` on the job's loop; also when each host answered (time.monotonic(), for the timeline).
    `joining`: hosts added to a running attempt, whose ranks run meanwhile."""
    for node, request in zip(nodes, requests, strict=True):
        node.send(PROBE, request)
    phase = ProbePhase(nodes, stall, progress, startup, joining)
    if progress is not None:
        progress(Progress("waiting for agents", len(nodes)))
    loop.run(phase)
    log.debug(
        "probe: %s answered in %.2fs", plural(len(nodes), "agent", "agents"), time.monotonic() - phase.began
    )
    return [phase.answers[id(node)] for node in nodes], phase.answered_at


def refuse_unfit(
    name: str, facts: Facts, *, cwd: str | None, command: Sequence[str], python: str | None
) -> None:
    """HostError (CommandNotFound) when host `name` cannot run the job: no working directory `cwd` (None:
    ranks run in a synced copy), no script, or no `--python` interpreter."""
    if cwd is not None and not facts.cwd_exists:
        raise HostError(f"host {name}: working directory {cwd} does not exist there", host=name)
    if not facts.script_found:
        raise CommandNotFound(f"host {name}: {command[0]} not found in {cwd or os.getcwd()} there")
    if python and not facts.python_found:
        raise HostError(f"host {name}: interpreter {python} not found there (see --python)", host=name)


def facts_text(facts: Facts) -> str:
    """-vv's line of what a host's agent reported: each known field as `name value`, no record's repr."""
    known = {k: v for k, v in dataclasses.asdict(facts).items() if v not in (None, "", [], {})}
    return "; ".join(f"{name.replace('_', ' ')} {value}" for name, value in known.items())
