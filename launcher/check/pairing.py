"""Who measures its link with whom, round by round (pure).

Every round is a perfect matching, so each host takes part in one transfer at a time and no link is shared
by two measurements. A host's link figure is its best over its partners: one slow host then slows only the
transfers it takes part in, and its partners still show their own speed with someone else. A host whose best
is still low is a suspect, re-tested against a host already known to be good before it is named.
"""

from __future__ import annotations

from collections.abc import Sequence

Pair = tuple[str, str]
Round = tuple[Pair, ...]

# Partners per host in the first pass: three, so that a good host paired with two slow ones still meets a
# good one, and two rounds of three host-to-host transfers at most.
FIRST_ROUNDS = 3


def matchings(hosts: Sequence[str], rounds: int = FIRST_ROUNDS) -> tuple[Round, ...]:
    """`rounds` perfect matchings of `hosts` by the circle method (every pair at most once); with an odd
    count one host sits each round out, a different one every round. Fewer rounds where there are fewer
    distinct partners to meet."""
    if len(hosts) < 2:
        return ()
    ring: list[str | None] = list(hosts)
    if len(ring) % 2:
        ring.append(None)
    count = min(rounds, len(ring) - 1)
    if len(hosts) % 2:
        # With a bye, rounds enough for every host to meet at least two partners (where it has two).
        count = min(max(count, 3), len(ring) - 1)
    fixed, rest = ring[0], ring[1:]
    result = []
    for r in range(count):
        turned = [fixed, *rest[r:], *rest[:r]]
        half = len(turned) // 2
        pairs = tuple(
            (a, b)
            for a, b in zip(turned[:half], reversed(turned[half:]), strict=True)
            if a is not None and b is not None
        )
        result.append(pairs)
    return tuple(result)


def retests(suspects: Sequence[str], good: Sequence[str]) -> tuple[Round, ...]:
    """Each suspect paired with a host known to be good (`good`, best first), each good host in one pair per
    round; as many rounds as the suspects need. No good host: nothing to test against."""
    if not good:
        return ()
    rounds = []
    for start in range(0, len(suspects), len(good)):
        batch = suspects[start : start + len(good)]
        rounds.append(tuple(zip(good, batch, strict=False)))
    return tuple(rounds)
