"""When an engine thread runs its rounds: a burst's gathering, the cycle while work is left, the idle wait.

Rounds pair up across ranks by their count, so every round one rank's thread runs is a round every other rank
runs too: a wait here paces the whole set.
"""

from __future__ import annotations

__all__ = ["BURST_CYCLES", "MAX_IDLE_WAIT_S", "burst_deadline", "next_waits"]

# An idle round is a gather on every rank's engine thread at once: one per 20 ms, with 4 ranks on 2 cores,
# cost DistributedOptimizer a sixth of its throughput once its steps went out unagreed (docs/performance.md).
# A tenth of a second still sees a dead peer, and runs the stall check, well within a human's notice.
MAX_IDLE_WAIT_S = 0.1
# How many cycles a burst of submissions may keep the engine thread's round waiting for more of it.
BURST_CYCLES = 8


def burst_deadline(first_new_at: float, last_new_at: float, cycle: float) -> float:
    """When the round of a burst begun at ``first_new_at`` starts: a cycle after its last submission, at most
    ``BURST_CYCLES`` after its first (Horovod's cycle: one burst, one round)."""
    return min(first_new_at + BURST_CYCLES * cycle, last_new_at + cycle)


def next_waits(busy: bool, idle_wait: float, cycle: float) -> tuple[float, float]:
    """The thread's wait before its next round and its idle wait, after a round (``busy``: work is left that
    only its rounds move on) or a skipped one (``busy`` False).

    Busy, the next round comes a cycle later and the idle wait stays where it was; otherwise the idle wait
    doubles, up to ``MAX_IDLE_WAIT_S``, and stays there, since new work wakes the thread at once. (Set back
    to a cycle after each busy round, it made an optimizer's step agreement cost four rounds on every rank
    instead of one at two ranks, a fifth of a small model's step on two cores.)
    """
    if busy:
        return cycle, idle_wait
    idle_wait = min(idle_wait * 2, MAX_IDLE_WAIT_S)
    return idle_wait, idle_wait
