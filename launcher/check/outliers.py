"""The rule that names a slow host, GPU or link among its peers (pure).

A figure is named only when it is far from the median of its peers by two measures at once: a floor on the
relative gap (so a tight healthy spread, where the deviation is near zero, does not name the slightly slower
half), and a number of robust standard deviations, from the median absolute deviation of the figures'
logarithms (so a wide healthy spread names nobody). Logarithms, because speeds spread by factors: a link at
half the median and one at twice it are as far off, and one a hundred times slower stands out however
widely the healthy ones wander. Both are needed on a shared machine, where healthy figures wander by tens of
percent from run to run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

# The median absolute deviation times this estimates the standard deviation of normally spread figures.
MAD_TO_SIGMA = 1.4826
# Fewer peers than this give no median to stand against: nobody is named.
MIN_PEERS = 3
# Figures are positive; a zero (nothing got through) is taken as this, so that its logarithm exists.
TINY = 1e-12


@dataclass(frozen=True)
class Rule:
    """`higher_is_better`: bandwidth and FLOP/s (a low figure is bad), not latency (a high one is).

    A figure is named when its gap from the median, in the bad direction, exceeds `min_gap` times the median,
    `min_abs` (in the figure's unit), and `z` robust standard deviations (or it is `certain` times worse).
    """

    higher_is_better: bool = True
    min_gap: float = 0.5
    z: float = 3.0
    min_abs: float = 0.0
    # A figure this many times worse than the median is named past the floors whatever the spread: with a
    # few hosts, one much faster than the rest (a re-test on idle cores) would otherwise widen the spread
    # enough to hide one a hundred times slower.
    certain: float = 10.0


# Per kind: throughput named below half the median; latency named above four times the median and a
# millisecond more (a busy machine delays a small message by that much without anything being wrong).
RULES: Mapping[str, Rule] = {
    "compute": Rule(),
    "gpu": Rule(),
    "intra-host": Rule(),
    "link": Rule(),
    "latency": Rule(higher_is_better=False, min_gap=3.0, min_abs=1e-3),
}


@dataclass(frozen=True)
class Spread:
    """The middle of a set of figures and how far they scatter around it."""

    median: float
    mad: float  # of the logarithms


def spread(values: Mapping[str, float]) -> Spread:
    logs = [math.log(max(v, TINY)) for v in values.values()]
    middle = statistics.median(logs)
    return Spread(statistics.median(values.values()), statistics.median(abs(x - middle) for x in logs))


def gap(value: float, median: float, rule: Rule) -> float:
    """How far `value` is from `median` in the bad direction (negative: on the good side)."""
    return median - value if rule.higher_is_better else value - median


def outliers(values: Mapping[str, float], rule: Rule) -> list[str]:
    """The keys of `values` whose figure is an outlier by `rule`, in the order given; none among fewer than
    MIN_PEERS figures, where a median says nothing."""
    if len(values) < MIN_PEERS:
        return []
    found = spread(values)
    middle = statistics.median(math.log(max(v, TINY)) for v in values.values())
    limit = max(rule.min_gap * abs(found.median), rule.min_abs)
    log_limit = min(rule.z * MAD_TO_SIGMA * found.mad, math.log(rule.certain))
    named = []
    for key, value in values.items():
        off = middle - math.log(max(value, TINY))
        if not rule.higher_is_better:
            off = -off
        if gap(value, found.median, rule) > limit and off > log_limit:
            named.append(key)
    return named
