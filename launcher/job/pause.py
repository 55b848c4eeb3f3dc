"""Between attempts, phases of the job's loop: the pause before a restart ends when `--restart-delay` has
passed, or with the job's outcome when a stopping signal or `--timeout` comes first. A host lost meanwhile is
dropped, not fatal: the next attempt reconnects it (or counts it lost)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from launcher.core.result import Outcome, Signalled
from launcher.runtime.loop import Deadline, Phase
from launcher.runtime.node import Node
from launcher.signals import stopping

log = logging.getLogger(__name__)


class BetweenAttempts(Phase[Node]):
    """What every phase between attempts shares: no rank runs, so a stopping signal or --timeout becomes the
    job's `outcome` (nothing to stop), and a lost host is only dropped."""

    def __init__(self, nodes: Sequence[Node], dead_after: float) -> None:
        super().__init__([(node, node) for node in nodes if not node.lost], dead_after)
        self.outcome: Outcome | None = None  # what ended the job meanwhile

    def listening(self, context: Node) -> bool:
        return not context.lost

    def on_signals(self, received: bytes, now: float) -> None:
        if stops := stopping(received):
            self.outcome = Signalled(stops[0])
            return
        for signum in received:
            self.on_signal(signum, now)

    def on_deadline(self, now: float, deadline: Deadline) -> None:
        self.outcome = deadline.outcome()

    def on_silent(self, context: Node, seconds: float, now: float) -> None:
        # No attempt runs to end: the next one reconnects the host, or counts it lost.
        log.warning(
            "host %s: no word from it for %.0fs before the restart; reconnecting it", context.name, seconds
        )
        context.drop()

    def on_closed(self, context: Node, now: float) -> None:
        detail = context.diagnostics()
        log.warning(
            "host %s: its agent's link closed before the restart%s; reconnecting it",
            context.name,
            f" ({detail})" if detail else "",
        )
        context.drop()


class Pause(BetweenAttempts):
    """--restart-delay."""

    def __init__(self, nodes: Sequence[Node], seconds: float, dead_after: float) -> None:
        super().__init__(nodes, dead_after)
        self.end = time.monotonic() + seconds

    @property
    def done(self) -> bool:
        return self.outcome is not None or time.monotonic() >= self.end

    def doing(self, now: float) -> str:
        return f"restarting in {max(0.0, self.end - now):.0f}s"

    def next_due(self) -> float | None:
        return self.end
