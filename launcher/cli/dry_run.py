"""`--dry-run`: the START requests a launch would send, printed (secrets redacted) instead of sent.

What only the hosts can say stands in: ports show as "auto", each host's interface as --network-interface
(or none), and each host has this interpreter.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from launcher.backends import api as backend
from launcher.core.command import interpreter, resolve_command
from launcher.core.config import LaunchConfig
from launcher.core.devices import Placement, RankDevices, assumed_hosts, describe, place_ranks
from launcher.core.env import join_host_port, redact
from launcher.core.forward import dropped_here
from launcher.core.plan import Plan, build_plan, plural
from launcher.core.rendezvous import Rendezvous
from launcher.core.start_requests import start_requests


def format_dry_run(config: LaunchConfig, environ: Mapping[str, str]) -> str:
    """The plan: what every rank inherits, then one header line per rank and its own variables (redacted)."""
    plan = build_plan(config.plan_inputs)
    python = interpreter(config.python)
    chosen = backend.get(config.launcher)
    local = chosen.local_by_name(plan.nodes)
    # Without links, rank 0's address is what the backend's rule gives, else its name.
    master_addr = chosen.master_address(config.master_addr, local, [None] * len(local)) or plan.nodes[0].name
    # Ports are probed on the hosts at launch: distinct stand-ins for the plan, shown as "auto".
    rdzv = Rendezvous(
        master_addr=master_addr,
        master_port=config.master_port or 0,
        node_addrs=tuple(
            master_addr if i == 0 or all(local) else node.name for i, node in enumerate(plan.nodes)
        ),
        tf_ports=tuple(tuple(s.rank for s in plan.node_slots(n)) for n in range(plan.node_count)),
    )
    jenv = config.job_env(environ)
    placed, placement_lines = _dry_run_placement(plan, config.placement)
    requests = start_requests(
        config, plan, rdzv, jenv, local=local, facts=[None] * plan.node_count,
        placed=placed, attempt=0, run_id="auto", cwd="",
        workers=[join_host_port(rdzv.node_addrs[s.node_rank], "auto") for s in plan.slots],
    )  # fmt: skip
    travelling = jenv.travelling
    source = "this shell (less the deny-list), --env-file, -x" if config.forward_env else "--env-file, -x"
    lines = [
        f"dry run: {plural(plan.world_size, 'process', 'processes')} on "
        f"{plural(plan.node_count, 'host', 'hosts')}; nothing is started",
        f"command: {shlex.join(resolve_command(config.command, python))}",
        # The agent adds these, as only it knows its directory (launcher.agent.stackdump).
        "each rank also gets the stack hook of `distrun stacks`: its agent's directory after PYTHONPATH, a "
        "warning filter that imports the hook after PYTHONWARNINGS, DISTRUN_STACK_DIR, DISTRUN_STACK_SIGNAL",
        f"every rank gets, from {source}:",
        *_assignments(redact(travelling, config.redact)),
    ]
    if config.launcher != "ssh":
        lines.append(f"launcher: {config.launcher}")
    if config.workdir is not None:
        lines.append(f"workdir: {config.workdir}, copied to every host's cache; ranks run in the copy")
    lines.extend(placement_lines)
    leftovers = dropped_here(environ, dict((*config.env_file, *config.exports)))
    if leftovers:
        lines.append(f"removed from every rank (left by another launcher): {' '.join(leftovers)}")
    if not config.forward_env and any(local):
        kept = " ".join(sorted(set(environ) - set(jenv.unset))) or "none"
        lines.append(f"ranks on this machine keep only its login variables (--no-forward-env): {kept}")
    slots = {slot.rank: slot for slot in plan.slots}
    for spec in (spec for request in requests for spec in request.ranks):
        own, defaults = dict(spec.env), dict(spec.defaults)
        if config.master_port is None:
            own["MASTER_PORT"] = "auto"
        if config.placement.binds and "OMP_NUM_THREADS" in defaults:
            defaults["OMP_NUM_THREADS"] = "auto"  # the rank's core count, known once its host is probed
        slot = slots[spec.rank]
        host = slot.host.name if slot.host.user is None else f"{slot.host.user}@{slot.host.name}"
        lines.append(f"rank {slot.rank}: host={host} local_rank={slot.local_rank} node_rank={slot.node_rank}")
        lines.extend(_assignments(redact(own, config.redact)))
        lines.extend(
            f"{line}  # unless the host sets it" for line in _assignments(redact(defaults, config.redact))
        )
    return "\n".join(lines)


def _assignments(env: Mapping[str, str]) -> list[str]:
    return [f"    {name}={shlex.quote(value)}" for name, value in sorted(env.items())]


def _dry_run_placement(plan: Plan, placement: Placement) -> tuple[tuple[RankDevices, ...], list[str]]:
    """Each rank's GPUs as the dry run assumes them, and lines saying what it assumes (it probes nothing)."""
    if not placement.active:
        return (), []
    lines = []
    gpus_only = Placement(gpus_per_rank=placement.gpus_per_rank)
    placed, _ = place_ranks(plan, assumed_hosts(plan, placement), gpus_only)
    if placement.gpus_per_rank is not None:
        lines.append(
            "GPUs, assuming each host shows enough, numbered from 0, and sets no CUDA_VISIBLE_DEVICES "
            "(at launch distrun hands out what each host shows, and refuses a host with too few):"
        )
        lines.extend(f"    {line}" for line in describe(plan, placed))
    if placement.binds:
        share = (
            "a share of the allowed cores of its GPUs' NUMA node (of the host's, where the node is unknown)"
            if placement.numa_binding
            else "an even share of its host's allowed cores"
        )
        lines.append(
            f"cores: at launch each rank is pinned to {share}, disjoint from the other ranks', and "
            "OMP_NUM_THREADS is its core count unless set"
        )
    return placed, lines
