"""The START request of every host of an attempt, built in one place from pure inputs (no side effects).

`Job.start` sends what `start_requests` builds, and `--dry-run` prints it (with stand-ins for what only the
hosts can say: ports, interfaces), so the dry run shows the very requests a launch sends. What every rank of
a host shares travels once per host (StartRequest.env); each RankSpec carries only the rank's own part.
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.agent.protocol import Facts, RankSpec, StartRequest
from launcher.core.command import interpreter, resolve_command
from launcher.core.config import LaunchConfig
from launcher.core.devices import RankDevices
from launcher.core.env import horovod_env, own_part, rank_env, tf_workers
from launcher.core.forward import LEFTOVER_PREFIXES, JobEnv
from launcher.core.plan import Plan
from launcher.core.rendezvous import Rendezvous


def start_requests(
    config: LaunchConfig,
    plan: Plan,
    rdzv: Rendezvous,
    jenv: JobEnv,
    *,
    local: Sequence[bool],
    facts: Sequence[Facts | None],
    placed: Sequence[RankDevices] | None,
    attempt: int,
    run_id: str,
    cwd: str,
    workers: Sequence[str] | None = None,
    workdirs: Sequence[str] | None = None,
) -> list[StartRequest]:
    """One StartRequest per node of `plan`, in node-rank order.

    `local[i]`: node i is this machine (its ranks lose `jenv.unset`, leftovers of another launcher here);
    `facts[i]`: what its agent reported, None where it was not asked (the dry run: --network-interface and
    this interpreter stand in). `workers`: TF_CONFIG's workers, when not `tf_workers(plan, rdzv)`.
    `workdirs[i]`: node i's --workdir copy, where its ranks run (None: no --workdir, or the dry run).
    ValueError when two nodes drew the same port (only two "hosts" that are this one machine can).
    """
    travelling = jenv.travelling
    workers = tf_workers(plan, rdzv) if workers is None else workers
    requests = []
    for node_rank in range(plan.node_count):
        found = facts[node_rank]
        python = interpreter(config.python, found is None or found.python_found)
        argv = list(resolve_command(config.command, python))
        ifname = config.network_interface or (found.route_ifname if found is not None else None)
        ranks = []
        for slot in plan.node_slots(node_rank):
            devices = placed[slot.rank] if placed else None
            contract, defaults = rank_env(
                slot, plan, rdzv, run_id=run_id, ifname=ifname, workers=workers, restart_count=attempt,
                max_restarts=config.restart.max_restarts, devices=devices,
            )  # fmt: skip
            contract.update(horovod_env(slot, plan))
            cpus = list(devices.cores) if devices and devices.cores is not None else None
            # A default that travels anyway is set already; the contract wins over what travels.
            defaults = {k: v for k, v in defaults.items() if k not in travelling}
            ranks.append(RankSpec(slot.rank, argv, own_part(contract, travelling), defaults, cpus))
        requests.append(
            StartRequest(
                cwd,
                config.grace_period,
                ranks,
                env=travelling,
                unset=list(jenv.unset) if local[node_rank] else [],
                unset_prefixes=list(LEFTOVER_PREFIXES),
                workdir=workdirs[node_rank] if workdirs else "",
                sample_interval=config.sample_interval,
                elastic=config.restart.elastic,
            )
        )
    return requests
