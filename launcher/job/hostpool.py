"""The job's hosts beyond one attempt: who is left out (the blacklist, named on the console) and the spares
that refill the world, and an elastic job's wait for --min-np slots between attempts (docs/attempts.md).

The decisions are `launcher.core.restart` and `launcher.core.blacklist` (pure); this holds their state for the
whole job and says them on the console, where every host left out is named with the reason and for how long.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence

from launcher.core.blacklist import Blacklist, CooldownRange, Exclusion
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.core.plan import Plan
from launcher.core.restart import GiveUp, HostBook, Restart, plan_restart
from launcher.core.result import Outcome
from launcher.errors import CommandNotFound, HostError
from launcher.runtime.node import HostAttempt, Node

# Polls of the discovery script while an elastic job waits for slots.
POLL = 1.0


class HostPool:
    def __init__(self, config: LaunchConfig, note: Callable[[list[str]], None]) -> None:
        """`note`: the console's distrun lines."""
        self.config = config
        self.note = note
        cooldown = config.restart.cooldown_range
        self.book = HostBook(Blacklist(CooldownRange(*cooldown) if cooldown else None))

    def spares(self, plan: Plan) -> tuple[Host, ...]:
        """The hosts of -H/--hostfile that hold no rank of `plan`, in their order: a restart's refill."""
        used = {h.name for h in plan.nodes}
        return tuple(h for h in self.config.hosts if h.name not in used)

    def spare_nodes(self, plan: Plan, nodes: Mapping[str, Node]) -> list[Node]:
        """An elastic job's connected spares (connected at its start), among `nodes`: hosts of -H/--hostfile
        without a rank of `plan`, not left out, not lost; a reset in place may start newcomers there."""
        if not self.config.restart.elastic:
            return []
        now = time.monotonic()
        spares = [h for h in self.spares(plan) if h.name in nodes and self.book.usable(h, now)]
        return [nodes[h.name] for h in spares if not nodes[h.name].lost]

    def probed(
        self, spares: Sequence[HostAttempt], probe: Callable[[Sequence[HostAttempt]], None]
    ) -> list[HostAttempt]:
        """The spares that answered `probe` (which probes the attempt's hosts with them) and are fit to run
        ranks; one that is not (silent, its link closed, no script or python there) is dropped and left out,
        named, and the probe made again without it: a spare never ends the job."""
        left = list(spares)
        while True:
            try:
                probe(left)
                return left
            except (HostError, CommandNotFound) as err:
                # CommandNotFound (no script there) names its host only in its line.
                failed = next((s for s in left if str(err).startswith(f"host {s.name}: ")), None)
                if failed is None:
                    raise
                failed.node.drop()
                self.leave_out(
                    failed.name, f"unfit as a spare ({str(err).removeprefix(f'host {failed.name}: ')})"
                )
                left.remove(failed)

    def snapshot(self) -> dict[str, Exclusion]:
        return dict(self.book.blacklist.excluded)

    def leave_out(self, host: str, reason: str, now: float | None = None) -> Exclusion:
        """Leave `host` out (the blacklist), named on the console with the reason and for how long."""
        before = self.snapshot()
        when = time.monotonic() if now is None else now
        exclusion = self.book.blacklist.add(host, reason, when, random.random())
        self.name_left_out(before)
        return exclusion

    def rank_failed(self, host: str, what: str) -> Exclusion | None:
        """A reset in place absorbed a rank's failure on `host`: counted as a whole restart's would be."""
        before = self.snapshot()
        exclusion = self.book.rank_failed(host, what, time.monotonic(), random.random())
        self.name_left_out(before)
        return exclusion

    def usable(self, host: str) -> bool:
        return self.book.blacklist.usable(host, time.monotonic())

    def exclusions(self, host: str) -> int:
        """How many times `host` was left out."""
        return self.book.blacklist.counts.get(host, 0)

    def name_left_out(self, before: Mapping[str, Exclusion]) -> None:
        """One console line for each host the blacklist took in since `before`."""
        now = time.monotonic()
        lines = [e.line(now) for name, e in self.book.blacklist.excluded.items() if before.get(name) is not e]
        if lines:
            self.note(lines)

    def wait_for_slots(
        self,
        verdict: GiveUp,
        reason: str,
        plan: Plan,
        discovered: Sequence[Host],
        *,
        pause: Callable[[float], Outcome | None],
        discover: Callable[[], tuple[Host, ...] | Outcome],
    ) -> Restart | GiveUp | Outcome:
        """An elastic job below --min-np waits up to --elastic-timeout for enough slots: the discovery script
        polled every second, or (fixed hosts) until a host's cooldown ends; nothing to wait for, it gives up
        at once. `pause(seconds)` and `discover()` run on the job's loop: a signal or --timeout meanwhile ends
        the wait with that outcome."""
        from launcher.job.slot_wait import wait_for_slots  # an elastic job's only (the policy loads with it)

        options = self.config.restart
        script = options.discovery_script is not None

        def look() -> Restart | GiveUp | Outcome:
            nonlocal discovered
            if script:
                found = discover()
                if isinstance(found, Outcome):
                    return found
                discovered = found
            return plan_restart(
                reason, None, options=options, hosts=plan.nodes, num_proc=plan.world_size, book=self.book,
                now=time.monotonic(), discovered=discovered, spares=self.spares(plan),
            )  # fmt: skip

        return wait_for_slots(
            look, timeout=options.elastic_timeout, polls=script, note=self.note, pause=pause, every=POLL,
            known=verdict,
        )  # fmt: skip
