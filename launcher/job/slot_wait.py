"""The one wait of an elastic job with fewer than --min-np usable slots (docs/attempts.md): at its start,
before any rank runs, and between attempts, both through `wait_for_slots`.

It looks again when something can have changed (the discovery script's next poll, else the first cooldown's
end: `launcher.core.elastic_policy.wake_at`), says once that it waits, and gives up at once where nothing can
come within --elastic-timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from launcher.core.elastic_policy import wake_at
from launcher.core.restart import GiveUp

Found = TypeVar("Found")
Ended = TypeVar("Ended")


def wait_for_slots(
    look: Callable[[], Found | GiveUp],
    *,
    timeout: float,
    polls: bool,
    note: Callable[[list[str]], None],
    pause: Callable[[float], Ended | None],
    every: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    known: GiveUp | None = None,
) -> Found | GiveUp | Ended:
    """`look()` until it finds enough slots (what it found is returned) or gives up (GiveUp: why, and when a
    host left out comes back). Each wait is `pause(seconds)`: what it returns, not None, ends the wait (a
    signal, the job's --timeout). Where nothing can come in time, the first look's GiveUp if it never waited,
    else one saying that not enough came back (`polls`: the discovery script is polled every `every` s).
    `known`: the first look's answer, where the caller has it already."""
    give_up_at = clock() + timeout
    first: GiveUp | None = None
    found: Found | GiveUp = look() if known is None else known
    while True:
        if not isinstance(found, GiveUp):
            return found
        now = clock()
        wake = wake_at(now, give_up_at, found.back_at, polls=polls, every=every)
        if wake is None:
            if first is None:
                return found
            came = f"not enough came back within --elastic-timeout {timeout:g}s"
            return GiveUp(f"{first.message}; {came}", below_min_np=True)
        if first is None:
            first = found
            what = "the discovery script's hosts" if polls else "a host's cooldown"
            note([f"{found.message}: waiting up to {timeout:g}s (--elastic-timeout) for {what}"])
        ended = pause(max(0.0, wake - now))
        if ended is not None:
            return ended
        found = look()
