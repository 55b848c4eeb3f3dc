"""An elastic job's first connections: it starts with the hosts it can reach (docs/attempts.md).

A fixed-size job needs every host of its plan, so the first one that cannot be reached ends it (exit 3). An
elastic one (`--min-np`) connects its spares too (hosts of -H/--hostfile beyond the slots in use), leaves a
host that cannot be reached out and takes the next spare in its place (or goes on with fewer ranks), as long
as at least `--min-np` slots are left; each host left out is named by the job, with the reason, once it
exists (`Job.pool.leave_out`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from launcher.core.blacklist import Blacklist, CooldownRange
from launcher.core.config import LaunchConfig
from launcher.core.plan import Plan, build_plan
from launcher.core.progress import ProgressFn
from launcher.core.restart import GiveUp
from launcher.errors import HostError
from launcher.runtime.control import ControlServer
from launcher.runtime.node import Node, connect


def connect_reachable(
    config: LaunchConfig,
    plan: Plan,
    progress: ProgressFn | None,
    *,
    control: ControlServer | None,
    note: Callable[[list[str]], None] = lambda lines: None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Plan, list[Node], list[tuple[str, str]]]:
    """The plan to start, the nodes connected (the plan's, in its order, then an elastic job's spares), and
    the hosts left out with why. A host of the plan that fails to connect is left out and the plan made
    again from the other hosts of the job; a spare that fails is only left out. Below --min-np slots, with
    --blacklist-cooldown-range, it waits (`sleep`; Ctrl-C interrupts it, nothing runs yet) for a host's
    cooldown to end and tries it again, up to --elastic-timeout, saying so (`note`). HostError when fewer
    than --min-np slots are left, or for a failure that names no host tried."""
    options = config.restart
    min_np = options.min_np
    if min_np is None:
        return plan, connect(plan.nodes, config, progress, control=control), []
    from launcher.core.elastic_policy import too_few  # an elastic job's only, as the wait for slots
    from launcher.job.slot_wait import wait_for_slots

    book = Blacklist(CooldownRange(*options.cooldown_range) if options.cooldown_range else None)

    def look() -> tuple[Plan, list[Node], list[tuple[str, str]]] | GiveUp:
        while True:
            now = time.monotonic()
            out = [e for e in book.excluded.values() if not book.usable(e.host, now)]
            hosts = [h for h in config.hosts if book.usable(h.name, now)]
            slots = sum(h.slots for h in hosts)
            if slots < min_np:
                below = too_few(slots, min_np, [h.name for h in hosts], verb="reachable") + "; "
                below += "; ".join(f"{e.host}: {e.reason}" for e in out)
                return GiveUp(below, below_min_np=True, back_at=book.back_at([e.host for e in out], now))
            made = plan
            if book.excluded:  # the plan again, from the hosts usable now
                made = build_plan(config.plan_inputs.resized(hosts, min(config.num_proc, slots)))
            used = {h.name for h in made.nodes}
            # Spares are connected at the start: a reset in place then starts newcomers there without
            # waiting for a login, and a dead spare is known before it is needed.
            spares = [h for h in hosts if h.name not in used]
            try:
                nodes = connect([*made.nodes, *spares], config, progress, control=control)
            except HostError as err:
                if err.host is None or err.host not in {h.name for h in hosts}:
                    raise
                book.add(err.host, _reason(str(err), err.host), time.monotonic(), random.random())
                continue
            return made, nodes, [(e.host, e.reason) for e in out]

    found = wait_for_slots(look, timeout=options.elastic_timeout, polls=False, note=note, pause=sleep)
    if isinstance(found, GiveUp):
        raise HostError(found.message or "")
    return found


def _reason(message: str, host: str) -> str:
    first = message.removeprefix(f"host {host}: ").removeprefix(f"{host}: ")
    return first.split(" (and ", 1)[0]
