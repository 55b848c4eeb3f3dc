"""A launch's `--preflight`: the `check --perf` measurement on the job's hosts before any rank starts, and
what it decides: nobody named, the job starts as planned; someone named, a fixed-size job ends (exit 3,
nothing started) and an elastic one (--min-np) starts on the others, unless that leaves too few ranks."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from launcher.check.perf import PerfResult, measure
from launcher.core.config import LaunchConfig
from launcher.core.elastic_policy import too_few
from launcher.core.plan import Plan, build_plan, plural
from launcher.errors import DeadlineReached, HostError
from launcher.runtime.loop import Loop
from launcher.runtime.node import Node, close_all

log = logging.getLogger(__name__)


class PreflightFailed(HostError):
    """Preflight named hosts the job cannot do without (exit 3); `perf` is the report's `perf` object."""

    def __init__(self, message: str, perf: dict[str, Any]) -> None:
        super().__init__(message)
        self.perf = perf


class PreflightTimedOut(DeadlineReached):
    """The job's --timeout ran out during the preflight (exit 124); `perf` as in PreflightFailed."""

    def __init__(self, message: str, perf: dict[str, Any]) -> None:
        super().__init__(message)
        self.perf = perf


def _say(lines: Sequence[str]) -> None:
    for line in lines:
        sys.stderr.write(f"distrun: preflight: {line}\n")
    sys.stderr.flush()


def preflight(
    config: LaunchConfig, plan: Plan, nodes: Sequence[Node], loop: Loop
) -> tuple[Plan, list[Node], dict[str, Any]]:
    """The plan and nodes to start on, and the report's `perf` object. PreflightFailed when a fixed-size job
    has a named host, or an elastic one would fall below --min-np; the hosts left out are closed.
    PreflightTimedOut when the job's --timeout (its `loop`'s deadline) ran out meanwhile: the hosts the
    measurement could not finish are the timeout's doing, not theirs."""
    result: PerfResult = measure(nodes, config, loop)
    record = result.record()
    if loop.deadline.passed(time.monotonic()):
        close_all(nodes)
        raise PreflightTimedOut("--timeout expired during --preflight; nothing was started", record)
    named = result.named
    lines = [o.line() for o in result.outliers] + [
        f"{p.host}: {p.what}; fix: {p.fix}" for p in result.problems
    ]
    if not named:
        _say([f"nobody named ({plural(len(nodes), 'host', 'hosts')} measured in {result.seconds:.1f}s)"])
        return plan, list(nodes), record
    _say(lines)
    names = ", ".join(named)
    min_np = config.restart.min_np
    # An elastic job's measured spares (its nodes beyond the plan's) take the named hosts' places.
    keep = tuple(n.host for n in nodes if n.name not in named)
    num_proc = min(plan.world_size, sum(h.slots for h in keep))
    if min_np is None:
        close_all(nodes)  # no job takes them over
        raise PreflightFailed(f"preflight named {names}; nothing was started", record)
    if num_proc < min_np:
        close_all(nodes)
        others = too_few(num_proc, min_np, [h.name for h in keep], without=names)
        raise PreflightFailed(f"preflight named {names}; {others}; nothing was started", record)
    for node in nodes:
        if node.name in named and not node.lost:
            node.link.close()
    _say([f"leaving out {names}; starting {plural(num_proc, 'rank', 'ranks')} on the other hosts"])
    plan = build_plan(config.plan_inputs.resized(keep, num_proc))
    return plan, [n for n in nodes if n.name not in named], record
