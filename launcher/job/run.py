"""Launch a planned job: connect to every host once, then run attempts until one ends the job.

Each attempt: probe every agent (host facts, free ports), rendezvous (a fresh MASTER_PORT), start the ranks,
supervise them to the attempt's outcome. This is the one place where planning (pure) meets side effects
(processes, SSH); the steps are methods so that a test can replace any of them, which keeps them in one
class, over 400 lines.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from launcher.agent.protocol import ADD, START, Facts
from launcher.backends import api as backend
from launcher.backends.locality import refuse_one_machine_twice
from launcher.console.progress import progress_line
from launcher.console.relay import LogRelay
from launcher.core.command import interpreter, script_of
from launcher.core.config import LaunchConfig
from launcher.core.devices import HostDevices, RankDevices, describe, place_ranks, shared_gpu_warnings
from launcher.core.forward import joined_env
from launcher.core.hosts import Host
from launcher.core.plan import Plan, build_plan, plural
from launcher.core.rendezvous import Rendezvous, choose_rendezvous
from launcher.core.restart import GiveUp, Restart, cause, decide
from launcher.core.result import HostLost, Outcome, RankFailed, Signalled
from launcher.core.start_requests import start_requests
from launcher.diagnose.watch import JobWatch
from launcher.errors import (
    DeadlineReached,
    HostError,
    Interrupted,
)
from launcher.job.attempt_hosts import AttemptHosts, same_software
from launcher.job.discovery import between_attempts
from launcher.job.hostpool import HostPool
from launcher.job.pause import Pause
from launcher.job.supervise import Supervisor, supervise
from launcher.report.account import (
    Attempt,
    Failure,
    rank_records,
)
from launcher.report.summary import summarize
from launcher.runtime.control import ControlServer
from launcher.runtime.loop import Deadline, Loop
from launcher.runtime.node import Heartbeat, HostAttempt, Node, agent_patience, connect
from launcher.runtime.probe import facts_text, probe_on, probe_requests, refuse_unfit

if TYPE_CHECKING:  # --workdir's modules load only for a job that has one, an elastic job's for one that is
    from launcher.core.elastic_plan import Member, NewWorld
    from launcher.job.elastic import ResetRecord, Resetter
    from launcher.job.host_watch import HostWatch
    from launcher.workdir.files import Workdir
    from launcher.workdir.sync import HostCopy

log = logging.getLogger(__name__)

# A reset's new identities: rank id -> its environment's contract.
Identities = Mapping[int, Mapping[str, str]]
# The probe gives up when no agent has answered for this long (see supervise.probe).
PROBE_STALL = 30.0
HEARTBEAT = 1.0


def job_loop(config: LaunchConfig, wake_fd: int, *, control: ControlServer | None = None) -> Loop:
    """The job's one loop, its --timeout counted from now; liveness checked at the backend's pace."""
    check_every = min(HEARTBEAT, backend.get(config.launcher).liveness(config).interval)
    deadline = Deadline(config.timeout, time.monotonic())
    return Loop(wake_fd, deadline=deadline, check_every=check_every, control=control)


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt, for the console and the summary: where it ran and how it ended."""

    index: int
    world_size: int
    hosts: tuple[str, ...]
    outcome: Outcome


class Job:
    """The attempt loop over connected nodes: initialize, monitor, restart (torchelastic's agent lifecycle).

    Each step is a method, so a test can replace one (say `run_attempt`) and check the loop around it.
    """

    def __init__(
        self,
        config: LaunchConfig,
        relay: LogRelay,
        loop: Loop,
        nodes: Sequence[Node],
        workdir: Workdir | None = None,
        *,
        watch: JobWatch | None = None,
    ) -> None:
        """`loop`: the job's (`job_loop`), which holds its --timeout."""
        self.config = config
        self.workdir = workdir
        # --workdir: each host's copy (this attempt's), and every sync's, for --report.
        self.copies: dict[str, HostCopy] = {}
        self.synced: dict[str, list[HostCopy]] = {}
        self.backend = backend.get(config.launcher)
        self.relay = relay
        self.watch = watch
        self.nodes = {node.name: node for node in nodes}
        self.run_id = os.urandom(6).hex()  # not `secrets`: its import alone costs 6 ms of start-up
        self.cwd = os.getcwd()
        # What every rank starts from beneath the contract: the same for every attempt.
        self.env = config.job_env(os.environ)
        self.dead_after = self.backend.liveness(config).dead_after
        # distrun's own words go to a terminal: its user may stop it (Ctrl-Z, kill -STOP) and come back, so
        # its agents wait for it however long (docs/usage.md, Signals). Elsewhere (a batch job, a pipe) a
        # distrun silent longer than its agents' patience is given up on.
        self.on_terminal = os.isatty(2)
        # Every phase that waits on the hosts runs on this one loop: signals, the deadline, liveness and
        # `distrun stacks` are handled alike in each. --timeout bounds the whole job, in every phase.
        self.loop = loop
        self.heartbeat = Heartbeat(nodes, loop.check_every)
        self.attempts: list[AttemptRecord] = []
        # What the agents measured, per attempt, for the end-of-run account and --report.
        self.accounts: list[Attempt] = []
        self.failure: Failure | None = None
        # Who is left out (the blacklist) and the spares that refill the world.
        self.pool = HostPool(config, relay.note)
        self.book = self.pool.book
        self.give_up: GiveUp | None = None
        self._last_port: int | None = None
        self.resets: list[ResetRecord] = []  # every reset in place, across attempts
        self._reset_limit_hit: str | None = None
        self.rank_hosts: dict[int, str] = {}
        self.world_hosts: tuple[Host, ...] = ()  # the last attempt's hosts, where its host watch changed them

    def run(self, plan: Plan) -> Outcome:
        """Attempts until one ends the job; the last attempt's outcome."""
        options = self.config.restart
        while True:
            index = len(self.attempts)
            if index:
                where = f"{plural(plan.node_count, 'host', 'hosts')}"
                self.relay.note([f"attempt {index}: {plural(plan.world_size, 'rank', 'ranks')} on {where}"])
            outcome = self.attempt(index, plan)
            self.attempts.append(
                AttemptRecord(index, plan.world_size, tuple(h.name for h in plan.nodes), outcome)
            )
            if self._reset_limit_hit is not None:
                # Horovod's rules ended the job (every rank failed, the (N+1)th reset would have begun...): a
                # whole restart would only fail or reset more.
                self.give_up = GiveUp(f"the job ends: {self._reset_limit_hit}")
                return outcome
            discovered = self.discover() if outcome.retryable and index < options.max_restarts else ()
            if isinstance(discovered, Outcome):
                return self.ended_between(discovered)
            before = self.pool.snapshot()
            decision: Restart | GiveUp | Outcome = decide(
                outcome,
                restarts_done=index,
                options=options,
                hosts=self.world_hosts or plan.nodes,  # as the discovery script last formed the world
                num_proc=plan.world_size,
                book=self.book,
                now=time.monotonic(),
                discovered=discovered,
                spares=self.pool.spares(plan),
                jitter=random.random(),
            )
            self.pool.name_left_out(before)
            if isinstance(decision, GiveUp) and decision.below_min_np:
                decision = self.pool.wait_for_slots(
                    decision, cause(outcome), plan, discovered, pause=self.pause, discover=self.discover
                )
            if isinstance(decision, Outcome):
                return self.ended_between(decision)
            if isinstance(decision, GiveUp):
                self.give_up = decision
                return outcome
            if decision.note:
                self.relay.note([decision.note])
            self.relay.note(
                [
                    f"attempt {index} failed: {decision.reason}; restarting in {options.delay:g}s "
                    f"(restart {index + 1} of {options.max_restarts})"
                ]
            )
            interrupted = self.pause(options.delay)
            if interrupted is not None:
                return self.ended_between(interrupted)
            was = {h.name for h in plan.nodes}
            plan = build_plan(self.config.plan_inputs.resized(decision.hosts, decision.num_proc))
            joining = [h.name for h in plan.nodes if h.name not in was]
            if joining:
                self.relay.note([f"attempt {index + 1} takes in {', '.join(joining)}"])

    def ended_between(self, outcome: Outcome) -> Outcome:
        """A signal or --timeout between attempts ends the job with that outcome."""
        self.failure = Failure(None, None, summarize(outcome, self.relay.stderr_tail)[0])
        return outcome

    def missing_file_lines(self, outcome: Outcome) -> list[str]:
        """A failed rank that did not find a file of --workdir that the copy left out: said so."""
        if self.workdir is None or not isinstance(outcome, RankFailed):
            return []
        from launcher.workdir.account import missing_file_lines

        rank = outcome.failure.rank
        return missing_file_lines(self.workdir, rank, self.relay.stderr_tail(rank))

    def closing_lines(self) -> list[str]:
        """Every attempt with its cause (when there was more than one), then why the job did not go on."""
        lines = []
        if len(self.attempts) > 1:
            lines.append(f"{len(self.attempts)} attempts:")
            lines.extend(
                f"  attempt {a.index}: {plural(a.world_size, 'rank', 'ranks')} on {', '.join(a.hosts)}: "
                f"{cause(a.outcome)}"
                for a in self.attempts
            )
        if self.give_up is not None and self.give_up.message and not self.give_up.below_min_np:
            lines.append(self.give_up.message)
        if self.resets:
            lines.append(f"{plural(len(self.resets), 'reset', 'resets')} in place")
        return lines

    # -- between attempts

    def discover(self) -> tuple[Host, ...] | Outcome:
        """The hosts the discovery script lists now; a signal or --timeout meanwhile ends the job (its
        outcome)."""
        return between_attempts(
            self.config.restart.discovery_script, self.loop, list(self.nodes.values()), self.dead_after,
            self.config.restart.slots_per_host,
        )  # fmt: skip

    def pause(self, seconds: float) -> Outcome | None:
        """Wait before a restart; a signal or --timeout meanwhile ends the job (None: the pause ran out)."""
        if self.loop.deadline.passed(time.monotonic()):
            return self.loop.deadline.outcome()
        pause = Pause(list(self.nodes.values()), seconds, self.dead_after)
        self.loop.run(pause)
        return pause.outcome

    def control(self) -> ControlServer | None:
        return self.watch.control if self.watch is not None else None

    def nodes_for(self, plan: Plan) -> list[Node]:
        """The plan's nodes in node-rank order: new or lost hosts connected, hosts left out closed."""
        in_plan = {h.name for h in plan.nodes}
        wanted = in_plan | {node.name for node in self.pool.spare_nodes(plan, self.nodes)}
        for name in [n for n in self.nodes if n not in wanted or self.nodes[n].lost]:
            node = self.nodes.pop(name)
            if not node.lost:
                node.link.close()
            elif name not in in_plan and self.pool.usable(name):  # an idle spare, lost between attempts
                self.pool.leave_out(name, "lost while a spare")
        missing = [h for h in plan.nodes if h.name not in self.nodes]
        if missing:
            doing = f"restarting: connecting to {plural(len(missing), 'host', 'hosts')}"
            with progress_line(sys.stderr) as line:
                fresh = connect(missing, self.config, line, control=self.control(), doing=doing)
            self.heartbeat.add(fresh)
            self.nodes.update((node.name, node) for node in fresh)
        return [self.nodes[h.name] for h in plan.nodes]

    def attempt(self, index: int, plan: Plan) -> Outcome:
        """`run_attempt`, where a later attempt's host that cannot be reached counts as lost, not fatal."""
        try:
            nodes = self.nodes_for(plan)
            if self.loop.deadline.passed(time.monotonic()):
                return self.loop.deadline.outcome()  # reconnecting took that long
            return self.run_attempt(index, plan, nodes)
        except DeadlineReached:
            return self.loop.deadline.outcome()
        except Interrupted as err:
            if index == 0:
                raise  # nothing ran yet: no outcome, only the signal's exit code
            return Signalled(err.exit_code - 128)
        except HostError as err:
            if index == 0 or err.host is None:
                raise
            if err.host in self.nodes:
                self.nodes[err.host].drop()
            return HostLost(err.host, str(err).removeprefix(f"host {err.host}: "))

    # -- one attempt, step by step

    def run_attempt(self, attempt: int, plan: Plan, nodes: Sequence[Node]) -> Outcome:
        # The attempt's own record of each host: nothing of an earlier attempt carries over.
        slots_by_node = [plan.node_slots(i) for i in range(plan.node_count)]
        hosts = [HostAttempt(node, slots) for node, slots in zip(nodes, slots_by_node, strict=True)]
        idle = [HostAttempt(node, (), idle=True) for node in self.pool.spare_nodes(plan, self.nodes)]
        self.rank_hosts = {s.rank: s.host.name for s in plan.slots}  # the console's prefixes, newcomers added
        self.relay.set_hosts(dict(self.rank_hosts))
        master_addr = self.master_addr(nodes)
        # One round with the plan's hosts (the software check compares them all), again without a bad spare.
        spares = self.pool.probed(idle, lambda spares: self.probe([*hosts, *spares], master_addr))
        if self.workdir is not None:
            self.copies = self.sync([*nodes, *(h.node for h in spares)], self.workdir)
        self.same_software([*hosts, *spares])
        placed = self.place(plan, hosts)
        rdzv = self.rendezvous(plan, hosts, master_addr)
        self.start(attempt, plan, hosts, rdzv, placed)
        # Every host of the attempt, spares included; a host the discovery script adds joins this list.
        self.hosts = self.attempt_hosts([*hosts, *spares], master_addr)
        everyone = self.hosts.everyone
        elastic = self.resetter(attempt, everyone, [h.node for h in everyone])
        host_watch: HostWatch | None = None
        if elastic is not None:  # only an elastic attempt watches its hosts
            from launcher.job.host_watch import watch_hosts

            host_watch = watch_hosts(
                self.config.restart, plan, elastic, self.hosts, self.pool.usable,
                exclusions=self.pool.exclusions, called_before=bool(self.attempts),
            )  # fmt: skip
        sup = Supervisor(
            everyone, self.relay, deadline=self.loop.deadline,  # the whole job's, restarts included
            grace=self.config.grace_period, dead_after=self.dead_after, watch=self.watch, elastic=elastic,
            host_watch=host_watch,
        )  # fmt: skip
        self.hosts.added = [sup.add_host] if elastic is None else [sup.add_host, elastic.add_host]
        if host_watch is not None:
            host_watch.attach(sup)
        started = time.time()
        if self.watch is not None:
            world = elastic.world if elastic is not None else None
            self.watch.attempt_started(hosts, time.monotonic(), world)
        try:
            outcome = supervise(sup, self.loop)
            if host_watch is not None and host_watch.fatal is not None:
                raise host_watch.fatal
        finally:
            if self.watch is not None:
                self.watch.attempt_ended()
            if host_watch is not None:
                host_watch.close()
                self.world_hosts = host_watch.known if host_watch.changed else ()
            self.record(attempt, started, sup, hosts)
            if elastic is not None:
                self.resets.extend(elastic.records)
                limit = elastic.refused is not None and elastic.refused.startswith("--reset-limit")
                if elastic.refused is not None and (elastic.final or limit):
                    self._reset_limit_hit = elastic.refused
        self.relay.finish()
        return outcome

    def resetter(self, attempt: int, hosts: Sequence[HostAttempt], nodes: Sequence[Node]) -> Resetter | None:
        """An elastic job's driver of resets in place (launcher.job.elastic); None for a fixed-size job."""
        options = self.config.restart
        if options.min_np is None:
            return None
        from launcher.job.elastic import Resetter

        def address_of(name: str) -> str:
            # self.nodes: a host the discovery script added mid-attempt is among them, not among `nodes`.
            first = [self.nodes[name]] + [n for n in nodes if n.name != name]
            return self.master_addr(first)

        return Resetter(
            hosts, min_np=options.min_np, reset_limit=options.reset_limit, run_id=self.run_id,
            max_restarts=options.max_restarts, master_addr=address_of, note=self.relay.note,
            done_before=len(self.resets), max_np=options.max_np, spawn=partial(self.spawn, attempt),
            leave_out=self.pool.leave_out, rank_failed=self.pool.rank_failed, usable=self.pool.usable,
            revive=self.hosts.revive,
        )  # fmt: skip

    def attempt_hosts(self, everyone: list[HostAttempt], master_addr: str) -> AttemptHosts:
        """The attempt's hosts (launcher.job.attempt_hosts), with how a host added while it runs is reached,
        probed (its software asked whatever the count) and refused."""

        def reach(new: Sequence[Host]) -> list[Node]:
            doing = f"adding {plural(len(new), 'host', 'hosts')}: connecting"
            with progress_line(sys.stderr) as line:
                fresh = connect(new, self.config, line, control=self.control(), doing=doing, briefly=True)
            self.heartbeat.add(fresh)
            self.nodes.update((node.name, node) for node in fresh)
            return fresh

        def admit(joined: Sequence[HostAttempt], hosts: Sequence[HostAttempt]) -> None:
            self.probe(joined, master_addr, joining=True)
            if self.workdir is not None:
                self.copies.update(self.sync([h.node for h in joined], self.workdir))
            self.same_software(hosts)

        def forget(nodes: Sequence[Node]) -> None:
            for node in nodes:
                self.nodes.pop(node.name, None)
                node.drop()

        return AttemptHosts(everyone, reach, admit, forget)

    def spawn(
        self,
        attempt: int,
        world: NewWorld,
        newcomers: Sequence[Member],
        envs: Identities,
    ) -> None:
        """Start a reset's newcomers (ADD, marked as joined) as ranks `world.rank_of`, under their own ids."""
        first = envs[newcomers[0].rank_id]
        rdzv = Rendezvous(first["MASTER_ADDR"], int(first["MASTER_PORT"]), (), ())
        by_name = self.hosts.by_name()
        nodes = [by_name[node.name] for node in world.plan.nodes]
        requests = start_requests(
            self.config, world.plan, rdzv, joined_env(self.env), local=[h.node.local for h in nodes],
            facts=[h.facts for h in nodes], placed=None, attempt=attempt, run_id=self.run_id,
            cwd=self.cwd, workers=(),
            workdirs=[self.copies[h.name].path for h in nodes] if self.copies else None,
        )  # fmt: skip
        wanted = {world.rank_of(member.rank_id): member.rank_id for member in newcomers}
        for host, request in zip(nodes, requests, strict=True):
            ranks = [dataclasses.replace(r, rank=wanted[r.rank]) for r in request.ranks if r.rank in wanted]
            if ranks:
                # A spare, or a host the discovery script added, runs no attempt yet: its first ranks START
                # one, and from then the attempt waits for it to end.
                kind = ADD if host.slots or host.name in self.hosts.began else START
                self.hosts.began.add(host.name)
                host.idle = False
                host.sent.update(r.rank for r in ranks)
                host.node.send(kind, dataclasses.replace(request, ranks=ranks))
        self.rank_hosts.update((member.rank_id, member.host.name) for member in newcomers)
        self.relay.set_hosts(dict(self.rank_hosts))

    def record(self, number: int, started: float, sup: Supervisor, hosts: Sequence[HostAttempt]) -> None:
        """The attempt's ranks as the agents measured them, for the account and --report."""
        progress = self.watch.stragglers.readings() if self.watch is not None else {}
        ranks = rank_records(
            sorted(self.rank_hosts.items()),  # the plan's ranks, and an elastic reset's newcomers
            sup.measured,
            progress,
            self.config.output_dir,
            samples=self.watch.samples_of_attempt() if self.watch is not None else None,
        )
        outcome = sup.outcome()
        self.accounts.append(Attempt(number, started, time.time(), outcome.name, outcome.exit_code, ranks))
        lines = summarize(outcome, self.relay.stderr_tail)
        failed = outcome.failure if isinstance(outcome, RankFailed) else None
        self.failure = None  # the last attempt's, if any: a job that succeeded after restarts has none
        if lines:
            self.failure = Failure(
                failed.rank if failed else None,
                failed.host if failed else getattr(outcome, "host", None),
                lines[0],
                tuple(self.relay.stderr_tail(failed.rank)) if failed else (),
            )

    def mark(self, phase: str, when: dict[str, float]) -> None:
        """The start-up timeline's marks of a phase the job's steps reach (the connections are marked as they
        open, the first output as it comes), host by host: when (time.monotonic()) each got there."""
        if self.watch is not None:
            for host, at in when.items():
                self.watch.timeline.mark(host, phase, at)

    def master_addr(self, nodes: Sequence[Node]) -> str:
        """An address of rank 0's host that every host can reach (never loopback when any host is remote)."""
        addr = self.backend.master_address(
            self.config.master_addr, [n.local for n in nodes], [n.link for n in nodes]
        )
        if addr:
            return addr
        rank0 = nodes[0]
        if not rank0.local:
            raise HostError(
                f"host {rank0.name}: reached through a proxy, so its address is unknown; give --master-addr"
            )
        raise HostError("every remote host is reached through a proxy; give --master-addr")

    def probe(self, hosts: Sequence[HostAttempt], master_addr: str, *, joining: bool = False) -> None:
        """Every host's facts, set on its record and checked: a missing cwd, script or python ends here.
        `joining`: hosts added to the running attempt (its ranks run meanwhile)."""
        synced = self.workdir is not None  # ranks run in the copy: its files were checked here, not there
        requests = probe_requests(
            hosts, route_to=master_addr, python=interpreter(self.config.python),
            cwd=None if synced else self.cwd, script=None if synced else script_of(self.config.command),
            heartbeat=self.loop.check_every, dead_after=agent_patience(self.dead_after),
            wait_while_stopped=self.on_terminal,
            # An elastic job's hosts are compared with any host that joins later: asked even when alone.
            software=True if self.config.restart.elastic else None,
        )  # fmt: skip
        nodes = [host.node for host in hosts]
        for node in nodes:
            node.waits_while_stopped = self.on_terminal
        remote = any(not n.local for n in nodes)
        with progress_line(sys.stderr) as line:
            # Local agents answer at once: a line only where remote hosts may keep one waiting.
            shown = line if remote else None
            answers, answered_at = probe_on(
                self.loop, nodes, requests, PROBE_STALL, shown, startup=self.config.startup_timeout,
                joining=joining,
            )  # fmt: skip
        self.mark("probed", answered_at)
        if self.backend.one_machine_per_host:
            # Two hosts whose agents are one machine would share its GPUs and LOCAL_RANKs.
            refuse_one_machine_twice([n.host for n in nodes], [facts.machine for facts in answers])
        for host, facts in zip(hosts, answers, strict=True):
            log.debug("host %s: %s", host.name, facts_text(facts))
            host.facts = facts
            refuse_unfit(
                host.name, facts, cwd=None if synced else self.cwd, command=self.config.command,
                python=self.config.python,
            )  # fmt: skip

    def sync(self, nodes: Sequence[Node], workdir: Workdir) -> dict[str, HostCopy]:
        """Every host's copy of the workdir, each sent only what it lacks (restarts: usually nothing)."""
        from launcher.agent.store import KEEP
        from launcher.workdir.account import log_sync
        from launcher.workdir.sync import sync

        remote = any(not n.local for n in nodes)
        with progress_line(sys.stderr) as line:
            copies = sync(
                nodes, workdir, stall=PROBE_STALL, dead_after=self.dead_after, wake_fd=self.loop,
                keep=KEEP, relay=self.config.workdir_relay, progress=line if remote else None,
            )  # fmt: skip
        for name, copy in copies.items():
            self.synced.setdefault(name, []).append(copy)
        log_sync(workdir, copies)
        return copies

    def same_software(self, hosts: Sequence[HostAttempt]) -> None:
        """Refuse hosts that would run another copy of the code, Python, torch, CUDA or NCCL."""
        workdirs = {name: copy.manifest_hash[:12] for name, copy in self.copies.items()}
        same_software(hosts, workdirs, allow_mismatch=self.config.allow_mismatch)

    def place(self, plan: Plan, hosts: Sequence[HostAttempt]) -> tuple[RankDevices, ...] | None:
        """Each rank's GPUs and cores from what the hosts reported; DeviceError (exit 3) if they cannot.

        A CUDA_VISIBLE_DEVICES that travels to every rank (`-x`, `--env-file` or this shell's, forwarded)
        replaces every host's own, so it is what chooses the GPUs handed out.
        """
        exported = self.env.travelling.get("CUDA_VISIBLE_DEVICES")
        devices = [HostDevices.from_json(_facts(host).devices) for host in hosts]
        if exported is not None:
            devices = [dataclasses.replace(d, visible_devices=exported) for d in devices]
        placement = self.config.placement
        if placement.gpus_per_rank is None:
            gpu_counts = [len(d.visible()) for d in devices]
            for warning in shared_gpu_warnings(plan, gpu_counts, self.config.command):
                log.warning("%s", warning)
        if not placement.active:
            return None
        placed, notes = place_ranks(plan, devices, placement)
        for note in notes:
            log.warning("%s", note)
        for line in describe(plan, placed):
            log.info("%s", line)
        return placed

    def rendezvous(self, plan: Plan, hosts: Sequence[HostAttempt], master_addr: str) -> Rendezvous:
        rdzv = choose_rendezvous(
            master_addr, given_port=self.config.master_port, last_port=self._last_port,
            names=[h.name for h in hosts], all_local=all(h.node.local for h in hosts),
            facts=[_facts(h) for h in hosts], slots=[len(h.slots) for h in hosts],
        )  # fmt: skip
        self._last_port = rdzv.master_port
        return rdzv

    def start(
        self,
        attempt: int,
        plan: Plan,
        hosts: Sequence[HostAttempt],
        rdzv: Rendezvous,
        placed: Sequence[RankDevices] | None = None,
    ) -> None:
        try:
            requests = start_requests(
                self.config, plan, rdzv, self.env, local=[h.node.local for h in hosts],
                facts=[h.facts for h in hosts], placed=placed, attempt=attempt, run_id=self.run_id,
                cwd=self.cwd, workdirs=[self.copies[h.name].path for h in hosts] if self.copies else None,
            )  # fmt: skip
        except ValueError:
            # Only two "hosts" that are one machine probe ports apart and can draw the same free port.
            names = ", ".join(h.name for h in hosts if h.node.local)
            raise HostError(
                f"{names} are this same machine and drew the same free port; list it once"
            ) from None
        sent = {}
        for host, request in zip(hosts, requests, strict=True):
            host.node.send(START, request)
            sent[host.name] = time.monotonic()
        self.mark("started", sent)
        log.info(
            "started %s on %s; rendezvous at %s:%d", plural(plan.world_size, "rank", "ranks"),
            plural(plan.node_count, "host", "hosts"), rdzv.master_addr, rdzv.master_port,
        )  # fmt: skip


def _facts(host: HostAttempt) -> Facts:
    assert host.facts is not None, "Job.probe sets every host's facts"
    return host.facts
