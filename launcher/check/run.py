"""`distrun check`, the side effects: reach every host on its own, probe it, judge with check.py, print.

Unlike a launch (all or nothing), one host failing does not stop the others: every host gets its row.
Rank 0's host is probed first and opens a listening TCP port; every other host then connects to it, the path
the rendezvous and NCCL/gloo will take.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace

import click

from launcher.agent.protocol import ProbeRequest
from launcher.backends import api as backend
from launcher.backends.api import Backend
from launcher.backends.bootstrap import NO_PYTHON
from launcher.backends.fanout import KEEP_GOING, fan_out
from launcher.backends.local import LocalLink
from launcher.backends.window import Window
from launcher.check.verdict import (
    HostCheck,
    findings,
    row,
    same_machines,
    software_findings,
    table,
    verdict,
    workdir_line,
)
from launcher.console.progress import progress_line
from launcher.console.writer import use_color
from launcher.core.command import interpreter
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.core.plan import build_plan
from launcher.core.progress import Progress, ProgressFn
from launcher.core.scrub import SCRUBBER
from launcher.errors import EXIT_HOST, EXIT_OK, HostError
from launcher.runtime.node import Node, close_all
from launcher.runtime.probe import probe
from launcher.signals import signal_pipe
from launcher.workdir.files import scan

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 120.0  # importing torch on a cold, busy host takes a while
MAX_PARALLEL = 32


def _failed(check: HostCheck, error: str, kind: str | None) -> HostCheck:
    """`check` with its error; an agent that found no interpreter is no SSH trouble, whatever reported it."""
    return replace(check, error=error, error_kind="python" if NO_PYTHON in error else kind)


Reached = tuple[Node | None, HostCheck]


def _connect(host: Host, local: bool, chosen: Backend, config: LaunchConfig) -> Reached:
    """A node with a running agent, or the HostCheck that says why there is none."""
    if local:
        return Node(host, LocalLink(host.name), True), HostCheck(
            host.name, host.slots, login_s=0.0, host_key="local", user=host.user
        )
    reached = chosen.open_for_check(host, config)
    check = HostCheck(host.name, host.slots, reached.login_s, reached.host_key, user=host.user)
    if reached.error is not None:
        check = _failed(check, reached.error, reached.error_kind)
    return (Node(host, reached.link, False) if reached.link is not None else None), check


def _drop(reached: Reached) -> None:
    if reached[0] is not None:
        reached[0].drop()


def _own(outcome: Reached | BaseException, host: Host) -> Reached:
    """A host's outcome; a HostError its backend raised (rather than reported) is that host's row."""
    if isinstance(outcome, BaseException):
        return None, _failed(HostCheck(host.name, host.slots, user=host.user), str(outcome), "other")
    return outcome


def _probe_one(node: Node, request: ProbeRequest, wake_fd: int, check: HostCheck) -> HostCheck:
    try:
        # A first, empty question: once it is answered the agent is up and waiting, so the second one's
        # reading time measures the clock, not the agent's start-up.
        probe([node], [ProbeRequest(ports=0, cwd=request.cwd)], PROBE_TIMEOUT, wake_fd)
        sent = time.time()
        [answer] = probe([node], [request], PROBE_TIMEOUT, wake_fd)
    except HostError as err:
        return _failed(check, str(err), "other")
    facts = asdict(answer)
    # The agent stamps the time it read the question: its offset from when we sent it, less the (small)
    # one-way delay, is the clock offset.
    offset = facts["time"] - sent if facts.get("time") else None
    return replace(check, probe=facts, clock_offset_s=offset)


def check_hosts(
    hosts: Sequence[Host],
    config: LaunchConfig,
    wake_fd: int,
    progress: ProgressFn,
    workdir_hash: str = "",
    *,
    chosen: Backend | None = None,
) -> list[HostCheck]:
    """Every host's HostCheck, in the order given, each host reached and probed on its own (one failing does
    not stop the others); `progress` hears how far probing got. `workdir_hash`: also ask whether each host's
    cache holds that --workdir copy. `chosen`: the backend, when the caller has it already."""
    chosen = chosen or backend.get(config.launcher)
    local = chosen.local_hosts(hosts, config)
    cwd = os.getcwd()
    python = interpreter(config.python)
    names = [h.name for h in hosts]
    index = {name: i for i, name in enumerate(names)}

    def reach(name: str, _: Window) -> Reached:
        return _connect(hosts[index[name]], local[index[name]], chosen, config)

    reached = fan_out(names, reach, _drop, policy=KEEP_GOING, limit=MAX_PARALLEL, phase="connecting")
    connected = [_own(reached[h.name], h) for h in hosts]
    nodes = [node for node, _ in connected]
    try:
        results = [check for _, check in connected]
        rank0 = nodes[0]
        listen_port = 0
        if rank0 is not None:
            # First rank 0's agent opens the port (quick); then every host is checked at once.
            try:
                request = ProbeRequest(ports=0, cwd=cwd, listen=True)
                listen_port = probe([rank0], [request], PROBE_TIMEOUT, wake_fd)[0].listen_port
            except HostError as err:
                results[0] = _failed(results[0], str(err), "other")
        rank0_addr = chosen.master_address(
            config.master_addr, local, [node.link if node is not None else None for node in nodes]
        )

        def check_one(name: str, _: Window) -> HostCheck:
            i = index[name]
            node, check = nodes[i], results[i]
            if node is None or check.error is not None:
                return check
            others = i > 0 and listen_port and rank0_addr
            request = ProbeRequest(
                ports=1,
                cwd=cwd,
                python=python,
                route_to=rank0_addr if i > 0 else None,
                check=True,
                software=True,
                workdir_hash=workdir_hash,
                connect_to=rank0_addr if others else None,
                connect_port=listen_port if others else 0,
            )
            return _probe_one(node, request, wake_fd, check)

        checked = fan_out(
            names,
            check_one,
            lambda _: None,
            policy=KEEP_GOING,
            limit=MAX_PARALLEL,
            phase="checking",
            progress=progress,
        )
        return [
            _failed(results[i], str(outcome), "other") if isinstance(outcome, BaseException) else outcome
            for i, outcome in enumerate(checked.values())
        ]
    finally:
        close_all([node for node in nodes if node is not None])


def run_check(config: LaunchConfig, perf: bool = False) -> int:
    """`distrun check`; `perf`: then measure the hosts that passed (launcher.check.perf)."""
    plan = build_plan(config.plan_inputs)
    chosen = backend.get(config.launcher)
    # --workdir: which hosts hold the copy a launch would run (bad input, as at launch, before any host).
    workdir = scan(config.workdir, config.workdir_limit) if config.workdir is not None else None
    hosts = [replace(h, slots=plan.local_size(i)) for i, h in enumerate(plan.nodes)]
    color = use_color(config.color)
    with progress_line(sys.stderr) as shown, signal_pipe() as wake_fd:
        shown(Progress("checking", len(hosts)))
        checks = check_hosts(
            hosts,
            config,
            wake_fd,
            shown,
            workdir.manifest_hash if workdir is not None else "",
            chosen=chosen,
        )
    cwd = os.getcwd()
    problems = [
        f
        for c in checks
        for f in findings(c, cwd=cwd, rank0=hosts[0].name, python_option=config.python, hosts_option="-H")
    ] + software_findings(checks, config.allow_mismatch)
    if chosen.one_machine_per_host:
        problems += same_machines(checks)
    lines = table([row(c) for c in checks])
    click.echo(click.style(lines[0], bold=True) if color else lines[0])
    for line, check in zip(lines[1:], checks, strict=True):
        state = "red" if any(f.fatal and f.host == check.host for f in problems) else "green"
        if any(not f.fatal and f.host == check.host for f in problems) and state == "green":
            state = "yellow"
        click.echo(click.style(line, fg=state) if color else line)
    if workdir is not None:
        click.echo(workdir_line(workdir.manifest_hash, len(workdir.files), workdir.total, checks))
    for finding in problems:
        label = "problem" if finding.fatal else "warning"
        click.echo(SCRUBBER(f"{finding.host}: {label}: {finding.what}; fix: {finding.fix}"))
    final = verdict(checks, problems)
    ready = final.startswith("ready")
    click.echo(click.style(final, fg="green" if ready else "red", bold=True) if color else final)
    if perf:
        from launcher.check.perf import perf_after_check

        failing = {f.host for f in problems if f.fatal}
        return perf_after_check(config, [h for h in hosts if h.name not in failing], color, ready)
    return EXIT_OK if ready else EXIT_HOST
