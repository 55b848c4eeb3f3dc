"""An elastic job's first connections: it starts with the hosts it can reach (docs/attempts.md).

A fixed-size job needs every host of its plan, so the first one that cannot be reached ends it (exit 3). An
elastic one (`--min-np`) connects its spares too (hosts of -H/--hostfile beyond the slots in use), leaves a
host that cannot be reached out and takes the next spare in its place (or goes on with fewer ranks), as long
as at least `--min-np` slots are left; each host left out is named by the job, with the reason, once it
exists (`Job.pool.leave_out`).
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.core.config import LaunchConfig
from launcher.core.plan import Plan, build_plan, plural
from launcher.core.progress import ProgressFn
from launcher.errors import HostError
from launcher.runtime.control import ControlServer
from launcher.runtime.node import Node, connect


def connect_reachable(
    config: LaunchConfig, plan: Plan, progress: ProgressFn | None, *, control: ControlServer | None
) -> tuple[Plan, list[Node], list[tuple[str, str]]]:
    """The plan to start, the nodes connected (the plan's, in its order, then an elastic job's spares), and
    the hosts left out with why (in the order they failed). A host of the plan that fails to connect is left
    out and the plan made again from the other hosts of the job; a spare that fails is only left out.
    HostError when fewer than --min-np slots are left, or for a failure that names no host tried."""
    min_np = config.restart.min_np
    if min_np is None:
        return plan, connect(plan.nodes, config, progress, control=control), []
    left_out: list[tuple[str, str]] = []
    while True:
        out = {name for name, _ in left_out}
        used = {h.name for h in plan.nodes}
        # Spares are connected at the start: a reset in place then starts newcomers there without waiting
        # for a login, and a dead spare is known before it is needed.
        spares = [h for h in config.hosts if h.name not in used and h.name not in out]
        try:
            return plan, connect([*plan.nodes, *spares], config, progress, control=control), left_out
        except HostError as err:
            if err.host is None or err.host not in used | {h.name for h in spares}:
                raise
            left_out.append((err.host, _reason(str(err), err.host)))
            if err.host not in used:
                continue
        out = {name for name, _ in left_out}
        hosts = [h for h in config.hosts if h.name not in out]
        slots = sum(h.slots for h in hosts)
        if slots < min_np:
            names = ", ".join(h.name for h in hosts) or "no hosts"
            raise HostError(
                f"only {plural(slots, 'slot', 'slots')} reachable ({names}), fewer than --min-np {min_np}; "
                f"{_named(left_out)}"
            )
        plan = build_plan(config.plan_inputs.resized(hosts, min(config.num_proc, slots)))


def _reason(message: str, host: str) -> str:
    first = message.removeprefix(f"host {host}: ").removeprefix(f"{host}: ")
    return first.split(" (and ", 1)[0]


def _named(left_out: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{name}: {reason}" for name, reason in left_out)
