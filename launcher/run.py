"""Launch a planned job: connect to every host once, then run attempts until one ends the job.

Each attempt: probe every agent (host facts, free ports), rendezvous (a fresh MASTER_PORT), start the ranks,
supervise them to the attempt's outcome. This is the one place where planning (pure) meets side effects
(processes, SSH); the steps are methods so that a test can replace any of them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import BinaryIO

from launcher.account import Attempt, Failure, RankRecord, Usage, build_report, format_account, write_report
from launcher.command import resolve_command
from launcher.config import LaunchConfig
from launcher.env import own_part, rank_env, tf_workers
from launcher.errors import CommandNotFound, HostError
from launcher.facts import Rendezvous
from launcher.forward import LEFTOVER_PREFIXES, job_env
from launcher.logs import LogOptions, LogRelay
from launcher.node import Heartbeat, Node, close_all, connect
from launcher.plan import Plan, Slot, make_plan
from launcher.protocol import START, Facts, ProbeRequest, RankSpec, StartRequest, encode_message
from launcher.result import HostLost, Outcome, RankFailed, Signalled, Succeeded, TimedOut
from launcher.summary import summarize
from launcher.supervise import Supervisor, probe, signal_pipe, supervise

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 30.0
HEARTBEAT = 1.0


def launch(config: LaunchConfig, out: BinaryIO | None = None, err: BinaryIO | None = None) -> int:
    """Run the job to its end; returns distrun's exit code. Raises DistrunError before anything started."""
    plan = make_plan(config.hosts, config.num_proc, config.oversubscribe)
    # Before anything starts anywhere: a bad --output-dir is bad input, not a failed job.
    relay = LogRelay(
        out or sys.stdout.buffer,
        err or sys.stderr.buffer,
        {s.rank: s.host.name for s in plan.slots},
        LogOptions(
            prefix=config.prefix,
            timestamp=config.timestamp,
            color=_use_color(config),
            console_ranks=config.console_ranks,
            output_dir=config.output_dir,
        ),
    )
    nodes: list[Node] = []
    try:
        # Connecting happens before signals are redirected: Ctrl-C then interrupts the handshakes at once.
        nodes = connect(plan.nodes, config)
        with signal_pipe() as wake_fd:
            job = Job(config, relay, wake_fd)
            try:
                with Heartbeat(nodes, min(HEARTBEAT, config.ssh.keepalive_interval)):
                    outcome = job.run(plan, nodes)
            finally:
                # Whatever ended the job, once ranks ran: the account, as a table and as --report.
                if job.attempts:
                    _account(config, job, relay)
            relay.note(summarize(outcome, relay.stderr_tail))
            return outcome.exit_code
    finally:
        # Links first: whatever happens to the console or the log files, the agents must hear EOF.
        try:
            close_all(nodes)
        finally:
            relay.close()


class Job:
    """The attempt loop over connected nodes: initialize, monitor, (later) restart."""

    def __init__(self, config: LaunchConfig, relay: LogRelay, wake_fd: int) -> None:
        self.config = config
        self.relay = relay
        self.wake_fd = wake_fd
        self.run_id = os.urandom(6).hex()  # not `secrets`: its import alone costs 6 ms of start-up
        self.cwd = os.getcwd()
        self.dead_after = config.ssh.keepalive_interval * config.ssh.keepalive_count
        self.attempts: list[Attempt] = []
        self.failure: Failure | None = None

    def run(self, plan: Plan, nodes: Sequence[Node]) -> Outcome:
        return self.run_attempt(0, plan, nodes)

    # -- one attempt, step by step

    def run_attempt(self, attempt: int, plan: Plan, nodes: Sequence[Node]) -> Outcome:
        for node, slots in zip(nodes, _slots_by_node(plan), strict=True):
            node.slots = slots
            node.finished = False
        master_addr = self.master_addr(nodes)
        self.probe(nodes, master_addr)
        rdzv = self.rendezvous(plan, nodes, master_addr)
        self.start(attempt, plan, nodes, rdzv)
        sup = Supervisor(
            nodes,
            self.relay,
            timeout=self.config.timeout,
            grace=self.config.grace_period,
            dead_after=self.dead_after,
            now=time.monotonic(),
        )
        started = time.time()
        try:
            outcome = supervise(sup, self.wake_fd, min(HEARTBEAT, self.config.ssh.keepalive_interval))
        finally:
            self.record(attempt, started, sup, nodes)
        self.relay.finish()
        return outcome

    def record(self, number: int, started: float, sup: Supervisor, nodes: Sequence[Node]) -> None:
        """The attempt's ranks as the agents measured them, for the account and --report."""
        out = self.config.output_dir
        ranks = []
        for node in nodes:
            for slot in node.slots:
                m = sup.measured.get(slot.rank)
                usage = Usage(m.wall_s, m.cpu_s, m.max_rss_kb) if m is not None and m.wall_s else None
                ranks.append(
                    RankRecord(
                        slot.rank,
                        node.name,
                        pid=(m.pid or None) if m is not None else None,
                        returncode=m.returncode if m is not None else None,
                        usage=usage,
                        log_dir=None if out is None else out / f"rank.{slot.rank}",
                    )
                )
        outcome = sup.outcome()
        self.attempts.append(
            Attempt(
                number, started, time.time(), OUTCOME_NAMES[type(outcome)], outcome.exit_code, tuple(ranks)
            )
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
        if self.config.master_addr:
            return self.config.master_addr
        if all(n.local for n in nodes):
            return "127.0.0.1"
        rank0 = nodes[0]
        if not rank0.local:
            if rank0.link.peer_addr:
                return rank0.link.peer_addr
            raise HostError(
                f"host {rank0.name}: reached through a proxy, so its address is unknown; give --master-addr"
            )
        for node in nodes:
            if not node.local and node.link.local_addr:
                return node.link.local_addr  # the address the remote hosts see this machine by
        raise HostError("every remote host is reached through a proxy; give --master-addr")

    def probe(self, nodes: Sequence[Node], master_addr: str) -> None:
        heartbeat = min(HEARTBEAT, self.config.ssh.keepalive_interval)
        python = self.config.python or sys.executable
        requests = [
            ProbeRequest(
                # Rank 0's host also probes the rendezvous port.
                ports=len(node.slots) + (1 if i == 0 else 0),
                cwd=self.cwd,
                route_to=master_addr,
                python=python,
                # A local agent needs no heartbeats: its pipe closing says all.
                heartbeat=heartbeat if node.link.heartbeat else 0.0,
                dead_after=self.dead_after if node.link.heartbeat else 0.0,
                script=_script(self.config.command),
            )
            for i, node in enumerate(nodes)
        ]
        probe(nodes, requests, PROBE_TIMEOUT, self.wake_fd)
        for node in nodes:
            log.debug("host %s: %s", node.name, node.facts)
            facts = _facts(node)
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

    def rendezvous(self, plan: Plan, nodes: Sequence[Node], master_addr: str) -> Rendezvous:
        all_local = all(n.local for n in nodes)
        node_addrs = tuple(
            master_addr if i == 0 or all_local else (_facts(node).route_addr or node.name)
            for i, node in enumerate(nodes)
        )
        master_port = self.config.master_port or _facts(nodes[0]).free_ports[0]
        tf_ports = tuple(
            tuple(_facts(node).free_ports[1:] if i == 0 else _facts(node).free_ports)[: len(node.slots)]
            for i, node in enumerate(nodes)
        )
        return Rendezvous(master_addr, master_port, node_addrs, tf_ports)

    def start(self, attempt: int, plan: Plan, nodes: Sequence[Node], rdzv: Rendezvous) -> None:
        config = self.config
        jenv = job_env(
            os.environ, forward=config.forward_env, env_file=config.env_file, exports=config.exports
        )
        travelling = jenv.travelling
        try:
            workers = tf_workers(plan, rdzv)
        except ValueError:
            # Only two "hosts" that are one machine probe ports apart and can draw the same free port.
            names = ", ".join(n.name for n in nodes if n.local)
            raise HostError(
                f"{names} are this same machine and drew the same free port; list it once"
            ) from None
        for node in nodes:
            facts = _facts(node)
            # `.py` commands: --python, else this interpreter's path where that host has it, else python3.
            python = config.python or (sys.executable if facts.python_found else "python3")
            argv = list(resolve_command(config.command, python))
            ranks = []
            for slot in node.slots:
                env, defaults = rank_env(
                    slot, plan, rdzv, run_id=self.run_id, exports=travelling, explicit=jenv.explicit,
                    ifname=config.network_interface or facts.route_ifname,
                    launcher_env=jenv.here if node.local else None, workers=workers,
                )  # fmt: skip
                # What every rank shares travels once per host (StartRequest.env), not once per rank.
                ranks.append(
                    RankSpec(slot.rank, argv, own_part(env, travelling), own_part(defaults, travelling))
                )
            request = StartRequest(
                self.cwd,
                config.grace_period,
                ranks,
                env=travelling,
                unset=list(jenv.unset) if node.local else [],
                unset_prefixes=list(LEFTOVER_PREFIXES),
            )
            node.send(encode_message(START, request))
        log.info(
            "started %d ranks on %d hosts; rendezvous at %s:%d", plan.world_size, plan.node_count,
            rdzv.master_addr, rdzv.master_port,
        )  # fmt: skip


def _facts(node: Node) -> Facts:
    assert node.facts is not None, "probe() sets every node's facts"
    return node.facts


def _slots_by_node(plan: Plan) -> list[tuple[Slot, ...]]:
    return [plan.node_slots(i) for i in range(plan.node_count)]


def _script(command: Sequence[str]) -> str | None:
    """The script file a `.py` command runs, checked on every host before anything starts."""
    return command[0] if command and command[0].endswith(".py") else None


OUTCOME_NAMES: dict[type, str] = {
    Succeeded: "succeeded",
    RankFailed: "rank-failed",
    HostLost: "host-lost",
    Signalled: "signalled",
    TimedOut: "timed-out",
}


def _account(config: LaunchConfig, job: Job, relay: LogRelay) -> None:
    last = job.attempts[-1]
    if len(last.ranks) > 1:
        relay.note(format_account(last.ranks).splitlines())
    if config.report is not None:
        report = build_report(
            run_id=job.run_id,
            command=config.command,
            exit_code=last.exit_code,
            attempts=job.attempts,
            failure=job.failure,
        )
        try:
            write_report(config.report, report)
        except OSError as err:
            log.error("cannot write the report %s: %s", config.report, err.strerror or err)


def _use_color(config: LaunchConfig) -> bool:
    if config.color is not None:
        return config.color
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ
