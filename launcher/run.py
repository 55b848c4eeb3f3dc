"""Launch a planned job: start one agent per host, preflight, rendezvous, start the ranks, supervise.

This is the one place where planning (pure) meets side effects (processes, SSH).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, BinaryIO

from launcher import agent as proto
from launcher.command import resolve_command
from launcher.config import LaunchConfig
from launcher.env import rank_env, tf_workers
from launcher.errors import HostError
from launcher.facts import HostFacts, Rendezvous
from launcher.locality import is_local_host, is_obviously_local
from launcher.logs import LogOptions, LogRelay
from launcher.plan import Plan, make_plan
from launcher.summary import summarize
from launcher.supervise import AgentConn, Supervisor, probe, signal_pipe
from launcher.transport.link import Link
from launcher.transport.local import LocalLink

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 30.0
HEARTBEAT = 1.0


def launch(config: LaunchConfig, out: BinaryIO | None = None, err: BinaryIO | None = None) -> int:
    """Run the job to its end; returns distrun's exit code. Raises DistrunError before anything started."""
    plan = make_plan(config.hosts, config.num_proc)
    run_id = os.urandom(6).hex()  # not `secrets`: its import alone costs 6 ms of start-up
    rank_hosts = {s.rank: s.host.name for s in plan.slots}
    # Before anything starts anywhere: a bad --output-dir is bad input, not a failed job.
    relay = LogRelay(
        out or sys.stdout.buffer,
        err or sys.stderr.buffer,
        rank_hosts,
        LogOptions(
            prefix=config.prefix,
            timestamp=config.timestamp,
            color=_use_color(config),
            console_ranks=config.console_ranks,
            output_dir=config.output_dir,
        ),
    )
    links: list[Link] = []
    try:
        local = _locality(plan, config)
        links = _open_links(plan, local, config)
        conns = [AgentConn(link) for link in links]
        with signal_pipe() as wake_fd:
            master_addr = _master_addr(config, links, local)
            python = config.python or sys.executable
            cwd = os.getcwd()
            requests = [
                {
                    "ports": plan.local_size(i) + (1 if i == 0 else 0),
                    "route_to": master_addr,
                    "cwd": cwd,
                    "python": python,
                }
                for i in range(plan.node_count)
            ]
            answers = probe(conns, requests, PROBE_TIMEOUT, wake_fd)
            facts = [HostFacts.from_json(a) for a in answers]
            for host, fact in zip(plan.nodes, facts, strict=True):
                log.debug("host %s: %s", host.name, fact)
            _preflight(plan, facts, cwd, config.python)
            rdzv = _rendezvous(config, plan, facts, master_addr, local)
            heartbeat = min(HEARTBEAT, config.ssh.keepalive_interval)
            dead_after = config.ssh.keepalive_interval * config.ssh.keepalive_count
            spec = {
                "cwd": cwd,
                "grace": config.grace_period,
                "heartbeat": heartbeat,
                "dead_after": dead_after,
            }
            _start(conns, spec, config=config, plan=plan, facts=facts, rdzv=rdzv, run_id=run_id, local=local)
            result = Supervisor(
                conns,
                rank_hosts,
                relay,
                timeout=config.timeout,
                grace=config.grace_period,
                heartbeat=heartbeat,
                dead_after=dead_after,
                wake_fd=wake_fd,
            ).run()
            relay.note(summarize(result, relay.stderr_tail))
            return result.exit_code
    finally:
        # Links first: whatever happens to the console or the log files, the agents must hear EOF.
        try:
            for link in links:
                link.close()
        finally:
            relay.close()


def _locality(plan: Plan, config: LaunchConfig) -> list[bool]:
    local = [is_obviously_local(h.name) for h in plan.nodes]
    if all(local):
        return local
    from launcher.transport.sshconn import load_ssh_config, resolve_target

    # Judge by what SSH would connect to: ~/.ssh/config may map `node1` to an address, or to this machine.
    ssh_config = load_ssh_config(config.ssh.config_file)
    return [
        is_local or is_local_host(resolve_target(h, config.ssh, ssh_config).hostname)
        for h, is_local in zip(plan.nodes, local, strict=True)
    ]


def _open_links(plan: Plan, local: Sequence[bool], config: LaunchConfig) -> list[Link]:
    remote_hosts = [h for h, is_local in zip(plan.nodes, local, strict=True) if not is_local]
    clients: dict[str, Any] = {}
    if remote_hosts:
        from launcher.transport.sshconn import connect_all  # paramiko is slow to import: only when needed

        clients = connect_all(remote_hosts, config.ssh)
    local_links: dict[str, Link] = {}
    try:
        for host in plan.nodes:
            if host not in remote_hosts:
                local_links[host.name] = LocalLink(host.name)
        remote_links: dict[str, Link] = {}
        if clients:
            from launcher.transport.ssh import open_links

            # The agent runs with the interpreter `.py` commands get: --python, else ours if there.
            pythons = [config.python] if config.python else [sys.executable, "python3"]
            remote_links.update(open_links(clients, pythons))
    except BaseException:
        for link in local_links.values():
            link.abort()
        for client in clients.values():
            client.close()
        raise
    return [local_links.get(h.name) or remote_links[h.name] for h in plan.nodes]


def _master_addr(config: LaunchConfig, links: Sequence[Link], local: Sequence[bool]) -> str:
    """An address of rank 0's host that every host can reach (never loopback when any host is remote)."""
    if config.master_addr:
        return config.master_addr
    if all(local):
        return "127.0.0.1"
    if not local[0]:
        addr = getattr(links[0], "peer_addr", None)
        if addr:
            return str(addr)
        raise HostError(
            f"host {links[0].host}: reached through a proxy, so its address is unknown; give --master-addr"
        )
    for link, is_local in zip(links, local, strict=True):
        addr = None if is_local else getattr(link, "local_addr", None)
        if addr:
            return str(addr)  # the address the remote hosts see this machine by
    raise HostError("every remote host is reached through a proxy; give --master-addr")


def _preflight(plan: Plan, facts: Sequence[HostFacts], cwd: str, python: str | None) -> None:
    for host, fact in zip(plan.nodes, facts, strict=True):
        if not fact.cwd_exists:
            raise HostError(f"host {host.name}: working directory {cwd} does not exist there")
        if python and not fact.python_found:
            raise HostError(f"host {host.name}: interpreter {python} not found there (see --python)")


def _rendezvous(
    config: LaunchConfig, plan: Plan, facts: Sequence[HostFacts], master_addr: str, local: Sequence[bool]
) -> Rendezvous:
    all_local = all(local)
    node_addrs = tuple(
        master_addr if i == 0 or all_local else (fact.route_addr or host.name)
        for i, (host, fact) in enumerate(zip(plan.nodes, facts, strict=True))
    )
    master_port = config.master_port or facts[0].free_ports[0]
    tf_ports = tuple(
        tuple(fact.free_ports[1:] if i == 0 else fact.free_ports)[: plan.local_size(i)]
        for i, fact in enumerate(facts)
    )
    return Rendezvous(master_addr, master_port, node_addrs, tf_ports)


def _start(
    conns: Sequence[AgentConn],
    spec: dict[str, Any],
    *,
    config: LaunchConfig,
    plan: Plan,
    facts: Sequence[HostFacts],
    rdzv: Rendezvous,
    run_id: str,
    local: Sequence[bool],
) -> None:
    exports = dict(config.exports)
    try:
        workers = tf_workers(plan, rdzv)
    except ValueError:
        # Only two "hosts" that are one machine probe ports apart and can draw the same free port.
        names = ", ".join(h.name for h, is_local in zip(plan.nodes, local, strict=True) if is_local)
        raise HostError(f"{names} are this same machine and drew the same free port; list it once") from None
    for node, conn in enumerate(conns):
        fact = facts[node]
        # `.py` commands: --python, else this interpreter's path where it exists on that host, else python3.
        argv = list(
            resolve_command(
                config.command, config.python or (sys.executable if fact.python_found else "python3")
            )
        )
        ranks = []
        for slot in plan.node_slots(node):
            env, defaults = rank_env(
                slot, plan, rdzv, run_id=run_id, exports=exports,
                ifname=config.network_interface or fact.route_ifname,
                launcher_env=os.environ if local[node] else None, workers=workers,
            )  # fmt: skip
            ranks.append({"rank": slot.rank, "argv": argv, "env": env, "defaults": defaults})
        # A local agent needs no heartbeats: its pipe closing says all (see Supervisor._check_hosts).
        node_spec = {**spec, "heartbeat": 0.0, "dead_after": 0.0} if local[node] else spec
        conn.send(proto.encode_json(proto.START, {**node_spec, "ranks": ranks}))
    log.info(
        "started %d ranks on %d hosts; rendezvous at %s:%d", plan.world_size, plan.node_count,
        rdzv.master_addr, rdzv.master_port,
    )  # fmt: skip


def _use_color(config: LaunchConfig) -> bool:
    if config.color is not None:
        return config.color
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ
