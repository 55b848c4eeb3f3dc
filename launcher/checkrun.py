"""`distrun check`, the side effects: reach every host on its own, probe it, hand the results to check.py.

Unlike a launch (all or nothing), one host failing does not stop the others: every host gets its row.
Rank 0's host is probed first and opens a listening TCP port; every other host then connects to it, the path
the rendezvous and NCCL/gloo will take.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace

from launcher.check import HostCheck
from launcher.config import LaunchConfig
from launcher.errors import HostError
from launcher.hosts import Host
from launcher.node import Node, close_all, locality, master_address
from launcher.protocol import ProbeRequest
from launcher.supervise import probe
from launcher.transport.bootstrap import NO_PYTHON
from launcher.transport.local import LocalLink

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 120.0  # importing torch on a cold, busy host takes a while
MAX_PARALLEL = 32


def _error_kind(message: str, auth: bool = False) -> str:
    if auth:
        return "auth"
    if NO_PYTHON in message:
        return "python"
    if "CHANGED" in message:
        return "host-key"
    if "unreachable" in message or "refused" in message or "resolve" in message:
        return "unreachable"
    return "other"


def _connect(host: Host, local: bool, config: LaunchConfig) -> tuple[Node | None, HostCheck]:
    """A node with a running agent, or the HostCheck that says why there is none."""
    slots = host.slots
    if local:
        return Node(host, LocalLink(host.name), True), HostCheck(
            host.name, slots, login_s=0.0, host_key="local", user=host.user
        )
    from launcher.transport.ssh import open_links
    from launcher.transport.sshconn import (
        AuthRefused,
        connect_target,
        has_known_key,
        jump_targets,
        load_ssh_config,
        resolve_target,
    )

    ssh_config = load_ssh_config(config.ssh.config_file)
    target = resolve_target(host, config.ssh, ssh_config)
    known = target.host_key_policy == "ignore" or has_known_key(target)
    started = time.monotonic()
    try:
        client = connect_target(target, config.ssh, jump_targets(target, config.ssh, ssh_config))
    except HostError as err:
        kind = _error_kind(str(err), isinstance(err, AuthRefused))
        return None, HostCheck(host.name, slots, error=str(err), error_kind=kind, user=host.user)
    login = time.monotonic() - started
    key = "unchecked" if target.host_key_policy == "ignore" else ("known" if known else "recorded")
    pythons = [config.python] if config.python else [sys.executable, "python3"]
    try:
        link = open_links({host.name: client}, pythons, limit=1)[host.name]
    except HostError as err:
        client.close()
        return None, HostCheck(host.name, slots, login, key, str(err), _error_kind(str(err)), user=host.user)
    return Node(host, link, False), HostCheck(host.name, slots, login_s=login, host_key=key, user=host.user)


def _probe_one(node: Node, request: ProbeRequest, wake_fd: int, check: HostCheck) -> HostCheck:
    try:
        # A first, empty question: once it is answered the agent is up and waiting, so the second one's
        # reading time measures the clock, not the agent's start-up.
        probe([node], [ProbeRequest(ports=0, cwd=request.cwd)], PROBE_TIMEOUT, wake_fd)
        sent = time.time()
        probe([node], [request], PROBE_TIMEOUT, wake_fd)
    except HostError as err:
        return replace(check, error=str(err), error_kind=_error_kind(str(err)))
    assert node.facts is not None
    facts = asdict(node.facts)
    # The agent stamps the time it read the question: its offset from when we sent it, less the (small)
    # one-way delay, is the clock offset.
    offset = facts["time"] - sent if facts.get("time") else None
    return replace(check, probe=facts, clock_offset_s=offset)


def check_hosts(
    hosts: Sequence[Host], config: LaunchConfig, wake_fd: int, progress: Callable[[int, int], None]
) -> list[HostCheck]:
    """Every host's HostCheck, in the order given; `progress(done, total)` after each host."""
    local = locality(hosts, config)
    cwd = os.getcwd()
    python = config.python or sys.executable
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        progress(done, len(hosts))

    workers = max(1, min(MAX_PARALLEL, len(hosts)))
    with ThreadPoolExecutor(workers) as pool:
        connected = list(pool.map(lambda host, is_local: _connect(host, is_local, config), hosts, local))
    nodes = [node for node, _ in connected]
    try:
        results = [check for _, check in connected]
        rank0 = nodes[0]
        listen_port = 0
        if rank0 is not None:
            # First rank 0's agent opens the port (quick); then every host is checked at once.
            try:
                probe([rank0], [ProbeRequest(ports=0, cwd=cwd, listen=True)], PROBE_TIMEOUT, wake_fd)
                listen_port = rank0.facts.listen_port if rank0.facts is not None else 0
            except HostError as err:
                results[0] = replace(results[0], error=str(err), error_kind=_error_kind(str(err)))
        rank0_addr = master_address(
            config.master_addr, local, [node.link if node is not None else None for node in nodes]
        )

        def check_one(index: int) -> HostCheck:
            node, check = nodes[index], results[index]
            if node is None or check.error is not None:
                return check
            others = index > 0 and listen_port and rank0_addr
            request = ProbeRequest(
                ports=1,
                cwd=cwd,
                python=python,
                route_to=rank0_addr if index > 0 else None,
                check=True,
                connect_to=rank0_addr if others else None,
                connect_port=listen_port if others else 0,
            )
            return _probe_one(node, request, wake_fd, check)

        with ThreadPoolExecutor(workers) as pool:
            for index, result in enumerate(pool.map(check_one, range(len(hosts)))):
                results[index] = result
                step()
        return results
    finally:
        close_all([node for node in nodes if node is not None])
