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
import select
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from launcher import backend
from launcher.account import Attempt, Failure, RankRecord, Usage, build_report, format_account, write_report
from launcher.config import LaunchConfig
from launcher.console import use_color
from launcher.devices import HostDevices, RankDevices, describe, place_ranks, shared_gpu_warnings
from launcher.errors import CommandNotFound, DistrunError, HostError
from launcher.facts import Rendezvous
from launcher.forward import job_env
from launcher.hosts import Host
from launcher.logs import LogOptions, LogRelay
from launcher.node import Heartbeat, HostAttempt, Node, close_all, connect
from launcher.plan import Plan, Slot, make_plan, plural
from launcher.progress import progress_line
from launcher.protocol import START, Facts, ProbeRequest
from launcher.restart import GiveUp, HostBook, cause, decide
from launcher.result import HostLost, Outcome, RankFailed, Signalled
from launcher.startreq import start_requests
from launcher.summary import summarize
from launcher.supervise import (
    FORWARDED_SIGNALS,
    STOP_SIGNALS,
    Supervisor,
    probe,
    read_signals,
    signal_pipe,
    supervise,
)

log = logging.getLogger(__name__)

# The probe gives up when no agent has answered for this long (see supervise.probe).
PROBE_STALL = 30.0
HEARTBEAT = 1.0


def launch(config: LaunchConfig, out_fd: int = 1, err_fd: int = 2) -> int:
    """Run the job to its end; returns distrun's exit code. Raises DistrunError before anything started."""
    plan = make_plan(config.hosts, config.num_proc, config.oversubscribe)
    # Before anything starts anywhere: a bad --output-dir is bad input, not a failed job.
    relay = LogRelay(
        out_fd,
        err_fd,
        _rank_hosts(plan),
        LogOptions(
            prefix=config.prefix,
            timestamp=config.timestamp,
            color=use_color(config.color),
            console_ranks=config.console_ranks,
            output_dir=config.output_dir,
            progress_interval=config.progress_interval,
        ),
    )
    job: Job | None = None
    try:
        # The first connections open before signals are redirected: Ctrl-C interrupts the handshakes at once.
        # A SIGUSR1/SIGUSR2 meanwhile has no rank to reach, and its default action would end distrun. (A
        # handler, not SIG_IGN: an ignored signal would stay ignored in every process started from here.)
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, lambda *_: None)
        with progress_line(sys.stderr) as line:
            nodes = connect(plan.nodes, config, line)
        with signal_pipe() as wake_fd:
            job = Job(config, relay, wake_fd, nodes)
            try:
                with job.heartbeat:
                    outcome = job.run(plan)
            finally:
                # Whatever ended the job, once ranks ran: the account, as a table and as --report.
                if job.accounts:
                    _account(config, job, relay)
            relay.note(summarize(outcome, relay.stderr_tail) + job.closing_lines())
            if job.give_up is not None and job.give_up.below_min_np:
                raise HostError(job.give_up.message or "too few ranks left")
            return outcome.exit_code
    finally:
        # Links first: whatever happens to the console or the log files, the agents must hear EOF.
        try:
            if job is not None:
                close_all(list(job.nodes.values()))
        finally:
            relay.close()


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

    def __init__(self, config: LaunchConfig, relay: LogRelay, wake_fd: int, nodes: Sequence[Node]) -> None:
        self.config = config
        self.backend = backend.get(config.launcher)
        self.relay = relay
        self.wake_fd = wake_fd
        self.nodes = {node.name: node for node in nodes}
        self.run_id = os.urandom(6).hex()  # not `secrets`: its import alone costs 6 ms of start-up
        self.cwd = os.getcwd()
        # What every rank starts from beneath the contract: the same for every attempt.
        self.env = job_env(
            os.environ, forward=config.forward_env, env_file=config.env_file, exports=config.exports
        )
        self.dead_after = config.ssh.keepalive_interval * config.ssh.keepalive_count
        self.check_every = min(HEARTBEAT, config.ssh.keepalive_interval)
        self.heartbeat = Heartbeat(nodes, self.check_every)
        self.started = time.monotonic()
        self.attempts: list[AttemptRecord] = []
        # What the agents measured, per attempt, for the end-of-run account and --report.
        self.accounts: list[Attempt] = []
        self.failure: Failure | None = None
        self.book = HostBook()
        self.give_up: GiveUp | None = None
        self._last_port: int | None = None

    def run(self, plan: Plan) -> Outcome:
        """Attempts until one ends the job; the last attempt's outcome."""
        options = self.config.restart
        while True:
            index = len(self.attempts)
            if index:
                self.relay.note([f"attempt {index}: {_ranks_on_hosts(plan)}"])
            outcome = self.attempt(index, plan)
            self.attempts.append(
                AttemptRecord(index, plan.world_size, tuple(h.name for h in plan.nodes), outcome)
            )
            decision = decide(
                outcome,
                restarts_done=index,
                options=options,
                hosts=plan.nodes,
                num_proc=plan.world_size,
                book=self.book,
                now=time.monotonic(),
                discovered=self.discover() if outcome.retryable and index < options.max_restarts else (),
            )
            if isinstance(decision, GiveUp):
                self.give_up = decision
                return outcome
            self.relay.note(
                [
                    f"attempt {index} failed: {decision.reason}; restarting in {options.delay:g}s "
                    f"(restart {index + 1} of {options.max_restarts})"
                ]
            )
            interrupted = self.pause(options.delay)
            if interrupted is not None:
                return interrupted
            plan = make_plan(decision.hosts, decision.num_proc)

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
        return lines

    # -- between attempts

    def discover(self) -> tuple[Host, ...]:
        script = self.config.restart.discovery_script
        if script is None:
            return ()
        from launcher.discovery import discover  # runs a program: only elastic jobs that name one need it

        try:
            return discover(script)
        except DistrunError as err:
            # A flaky discovery script must not end a job that could go on with the hosts it has.
            log.warning("%s; going on with the hosts already known", err)
            return ()

    def pause(self, seconds: float) -> Outcome | None:
        """Wait before a restart; a signal meanwhile ends the job (None: the pause ran out)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.wake_fd], [], [], left)
            if readable:
                received = read_signals(self.wake_fd)
                stop = [s for s in received if s in STOP_SIGNALS]
                if stop:
                    return Signalled(stop[0])
        return None

    def nodes_for(self, plan: Plan) -> list[Node]:
        """The plan's nodes in node-rank order: new or lost hosts connected, hosts left out closed."""
        wanted = {h.name for h in plan.nodes}
        for name in [n for n in self.nodes if n not in wanted or self.nodes[n].lost]:
            node = self.nodes.pop(name)
            if not node.lost:
                node.link.close()
        missing = [h for h in plan.nodes if h.name not in self.nodes]
        if missing:
            with progress_line(sys.stderr) as line:
                fresh = connect(missing, self.config, line)
            self.heartbeat.add(fresh)
            self.nodes.update((node.name, node) for node in fresh)
        return [self.nodes[h.name] for h in plan.nodes]

    def attempt(self, index: int, plan: Plan) -> Outcome:
        """`run_attempt`, where a later attempt's host that cannot be reached counts as lost, not fatal."""
        try:
            return self.run_attempt(index, plan, self.nodes_for(plan))
        except HostError as err:
            if index == 0 or err.host is None:
                raise
            if err.host in self.nodes:
                self.nodes[err.host].drop()
            return HostLost(err.host, str(err).removeprefix(f"host {err.host}: "))

    # -- one attempt, step by step

    def run_attempt(self, attempt: int, plan: Plan, nodes: Sequence[Node]) -> Outcome:
        # The attempt's own record of each host: nothing of an earlier attempt carries over.
        hosts = [HostAttempt(node, slots) for node, slots in zip(nodes, _slots_by_node(plan), strict=True)]
        self.relay.set_hosts(_rank_hosts(plan))
        master_addr = self.master_addr(nodes)
        self.probe(hosts, master_addr)
        placed = self.place(plan, hosts)
        rdzv = self.rendezvous(plan, hosts, master_addr)
        self.start(attempt, plan, hosts, rdzv, placed)
        sup = Supervisor(
            hosts,
            self.relay,
            # --timeout bounds the whole job, restarts included.
            timeout=self.config.timeout,
            grace=self.config.grace_period,
            dead_after=self.dead_after,
            now=self.started,
        )
        started = time.time()
        try:
            outcome = supervise(sup, self.wake_fd, self.check_every)
        finally:
            self.record(attempt, started, sup, hosts)
        self.relay.finish()
        return outcome

    def record(self, number: int, started: float, sup: Supervisor, hosts: Sequence[HostAttempt]) -> None:
        """The attempt's ranks as the agents measured them, for the account and --report."""
        out = self.config.output_dir
        ranks = []
        for host in hosts:
            for slot in host.slots:
                m = sup.measured.get(slot.rank)
                usage = Usage(m.wall_s, m.cpu_s, m.max_rss_kb) if m is not None and m.wall_s else None
                ranks.append(
                    RankRecord(
                        slot.rank,
                        host.name,
                        pid=(m.pid or None) if m is not None else None,
                        returncode=m.returncode if m is not None else None,
                        usage=usage,
                        log_dir=None if out is None else out / f"rank.{slot.rank}",
                    )
                )
        outcome = sup.outcome()
        self.accounts.append(
            Attempt(number, started, time.time(), outcome.name, outcome.exit_code, tuple(ranks))
        )
        lines = summarize(outcome, self.relay.stderr_tail)
        failed = outcome.failure if isinstance(outcome, RankFailed) else None
        if lines:
            self.failure = Failure(
                failed.rank if failed else None,
                failed.host if failed else getattr(outcome, "host", None),
                lines[0],
                tuple(self.relay.stderr_tail(failed.rank)) if failed else (),
            )

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

    def probe(self, hosts: Sequence[HostAttempt], master_addr: str) -> None:
        """Every host's facts, set on its record and checked: a missing cwd, script or python ends here."""
        heartbeat = self.check_every
        python = self.config.python or sys.executable
        requests = [
            ProbeRequest(
                # Rank 0's host also probes two rendezvous ports: one differs from the last attempt's.
                ports=len(host.slots) + (2 if i == 0 else 0),
                cwd=self.cwd,
                route_to=master_addr,
                python=python,
                # A local agent needs no heartbeats: its pipe closing says all.
                heartbeat=heartbeat if host.link.heartbeat else 0.0,
                dead_after=self.dead_after if host.link.heartbeat else 0.0,
                script=_script(self.config.command),
            )
            for i, host in enumerate(hosts)
        ]
        nodes = [host.node for host in hosts]
        remote = any(not n.local for n in nodes)
        with progress_line(sys.stderr) as line:
            # Local agents answer at once: a line only where remote hosts may keep one waiting.
            answers = probe(nodes, requests, PROBE_STALL, self.wake_fd, line if remote else None)
        for node, host, facts in zip(nodes, hosts, answers, strict=True):
            log.debug("host %s: %s", node.name, facts)
            host.facts = facts
            if not facts.cwd_exists:
                raise HostError(
                    f"host {node.name}: working directory {self.cwd} does not exist there", host=node.name
                )
            if not facts.script_found:
                raise CommandNotFound(
                    f"host {node.name}: {self.config.command[0]} not found in {self.cwd} there"
                )
            if self.config.python and not facts.python_found:
                raise HostError(
                    f"host {node.name}: interpreter {self.config.python} not found there (see --python)",
                    host=node.name,
                )

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
        all_local = all(h.node.local for h in hosts)
        node_addrs = tuple(
            master_addr if i == 0 or all_local else (_facts(host).route_addr or host.name)
            for i, host in enumerate(hosts)
        )
        # Rank 0's host probed two rendezvous candidates first (see `probe`), then its ranks' ports.
        candidates, rank0_ports = _facts(hosts[0]).free_ports[:2], _facts(hosts[0]).free_ports[2:]
        fresh = next(p for p in candidates if p != self._last_port)
        master_port = self.config.master_port or fresh
        self._last_port = master_port
        tf_ports = tuple(
            tuple(rank0_ports if i == 0 else _facts(host).free_ports)[: len(host.slots)]
            for i, host in enumerate(hosts)
        )
        return Rendezvous(master_addr, master_port, node_addrs, tf_ports)

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
                cwd=self.cwd,
            )  # fmt: skip
        except ValueError:
            # Only two "hosts" that are one machine probe ports apart and can draw the same free port.
            names = ", ".join(h.name for h in hosts if h.node.local)
            raise HostError(
                f"{names} are this same machine and drew the same free port; list it once"
            ) from None
        for host, request in zip(hosts, requests, strict=True):
            host.node.send(START, request)
        log.info(
            "started %d ranks on %d hosts; rendezvous at %s:%d", plan.world_size, plan.node_count,
            rdzv.master_addr, rdzv.master_port,
        )  # fmt: skip


def _facts(host: HostAttempt) -> Facts:
    assert host.facts is not None, "Job.probe sets every host's facts"
    return host.facts


def _rank_hosts(plan: Plan) -> dict[int, str]:
    return {s.rank: s.host.name for s in plan.slots}


def _ranks_on_hosts(plan: Plan) -> str:
    return f"{plural(plan.world_size, 'rank', 'ranks')} on {plural(plan.node_count, 'host', 'hosts')}"


def _slots_by_node(plan: Plan) -> list[tuple[Slot, ...]]:
    return [plan.node_slots(i) for i in range(plan.node_count)]


def _script(command: Sequence[str]) -> str | None:
    """The script file a `.py` command runs, checked on every host before anything starts."""
    return command[0] if command and command[0].endswith(".py") else None


def _account(config: LaunchConfig, job: Job, relay: LogRelay) -> None:
    last = job.accounts[-1]
    if len(last.ranks) > 1:
        relay.note(format_account(last.ranks).splitlines())
    if config.report is not None:
        report = build_report(
            run_id=job.run_id,
            command=config.command,
            exit_code=last.exit_code,
            attempts=job.accounts,
            failure=job.failure,
        )
        try:
            write_report(config.report, report)
        except OSError as err:
            log.error("cannot write the report %s: %s", config.report, err.strerror or err)
