"""`distrun check --perf`'s figures and who they name (pure): per host compute, GPUs, intra-host bus
bandwidth, and per pair of hosts the link both ways; the outliers by launcher.check.outliers' rule.

A host's link figure is its best over its partners (see launcher.check.pairing): a host is slow only when it
was slow with everyone, a re-test against a good host included.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.check.outliers import RULES, Rule, outliers, spread

GPU_ADVICE = "check its clocks, temperature and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE)"
ADVICE = {
    "compute": "check its CPU load, frequency scaling and cgroup/cpuset limits",
    "gpu": GPU_ADVICE,
    "intra-host": "check its GPU topology and links (nvidia-smi topo -m, nvidia-smi nvlink -s)",
    "link": "check its NIC and cable (ethtool: speed, errors)",
    "latency": "check its NIC, cable and interrupt load",
}
UNITS = {"compute": "GFLOP/s", "gpu": "TFLOP/s", "intra-host": "B/s", "link": "B/s", "latency": "s"}


@dataclass(frozen=True)
class Gpu:
    """One GPU of a host as `check --perf` measured it."""

    index: int
    name: str
    dtype: str
    tflops: float


@dataclass(frozen=True)
class HostFigures:
    """What one host's measurement process reported about itself (None: not measured there)."""

    host: str
    backend: str = "gloo"
    compute_gflops: float | None = None
    gpus: tuple[Gpu, ...] = ()
    intra_host_bps: float | None = None


@dataclass(frozen=True)
class LinkSample:
    """One pair's transfers: what each side sent at (bytes/s) and the one-way latency (s)."""

    a: str
    b: str
    a_out: float
    b_out: float
    latency_s: float
    retest: bool = False


@dataclass(frozen=True)
class Outlier:
    """A named figure: `value` against the `median` of its peers, in `unit`; `detail` says which GPU or
    which direction, and with whom."""

    host: str
    kind: str
    value: float
    median: float
    unit: str
    text: str

    def line(self) -> str:
        return f"{self.host}: {self.text}: {ADVICE[self.kind]}"

    def record(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "kind": self.kind,
            "value": self.value,
            "median": self.median,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class LinkFigures:
    """Per host its best over its partners: bytes/s in and out, and latency."""

    inbound: dict[str, float] = field(default_factory=dict)
    outbound: dict[str, float] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)


def link_figures(samples: Iterable[LinkSample]) -> LinkFigures:
    figures = LinkFigures()
    for s in samples:
        for me, out, inbound in ((s.a, s.a_out, s.b_out), (s.b, s.b_out, s.a_out)):
            figures.outbound[me] = max(figures.outbound.get(me, 0.0), out)
            figures.inbound[me] = max(figures.inbound.get(me, 0.0), inbound)
            figures.latency[me] = min(figures.latency.get(me, float("inf")), s.latency_s)
    return figures


def suspects(samples: Sequence[LinkSample]) -> list[str]:
    """Hosts whose link figures (first pass) are outliers: to be re-tested against a good host."""
    figures = link_figures(samples)
    found = (
        outliers(figures.inbound, RULES["link"])
        + outliers(figures.outbound, RULES["link"])
        + outliers(figures.latency, RULES["latency"])
    )
    return [host for host in figures.outbound if host in found]


def compute_suspects(hosts: Sequence[HostFigures]) -> list[str]:
    """Hosts whose compute, a GPU's or intra-host figure is an outlier: to be measured again, alone."""
    named = {o.host for o in judge(hosts, [])}
    return [h.host for h in hosts if h.host in named]


COMPUTE_KINDS = ("compute", "gpu", "intra-host")


def references(hosts: Sequence[HostFigures], suspected: Sequence[str]) -> list[str]:
    """Hosts to re-test compute suspects against: as many as there are suspects (at least one), the best
    of the others first."""

    def score(h: HostFigures) -> float:
        return min((g.tflops for g in h.gpus), default=h.compute_gflops or 0.0)

    good = sorted((h for h in hosts if h.host not in suspected), key=score, reverse=True)
    return [h.host for h in good[: max(1, len(suspected))]]


def still_slow(again: HostFigures, refs: Sequence[HostFigures]) -> bool:
    """Whether a compute suspect, measured again at the same time as hosts known to be good (`refs`, the
    same moment's figures), is still below the floor of the rule against them: the comparison is made under
    the same conditions, so a machine that got busier or quieter meanwhile moves both alike."""

    def below(mine: float | None, theirs: Iterable[float | None], kind: str) -> bool:
        present = [v for v in theirs if v is not None]
        if mine is None or not present:
            return False
        return mine < (1.0 - RULES[kind].min_gap) * statistics.median(present)

    return (
        below(again.compute_gflops, (r.compute_gflops for r in refs), "compute")
        or below(
            min((g.tflops for g in again.gpus), default=None), (g.tflops for r in refs for g in r.gpus), "gpu"
        )
        or below(again.intra_host_bps, (r.intra_host_bps for r in refs), "intra-host")
    )


def size(value: float) -> str:
    """Bytes/s for people: 2.4 MB/s, 1.1 GB/s."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B/s"


def seconds(value: float) -> str:
    return f"{value * 1e3:.2f} ms" if value >= 1e-3 else f"{value * 1e6:.0f} µs"


def _names(hosts: Sequence[str]) -> str:
    if len(hosts) == 1:
        return hosts[0]
    if len(hosts) == 2:
        return f"both {hosts[0]} and {hosts[1]}"
    return f"{', '.join(hosts[:-1])} and {hosts[-1]}"


def _slow_with(host: str, samples: Sequence[LinkSample], median: float, rule: Rule) -> list[str]:
    """The partners `host` was slow with, either way, in the order measured."""
    partners = []
    for s in samples:
        if host not in (s.a, s.b):
            continue
        partner = s.b if s.a == host else s.a
        if min(s.a_out, s.b_out) < median - rule.min_gap * median and partner not in partners:
            partners.append(partner)
    return partners


def _link_outliers(samples: Sequence[LinkSample]) -> list[Outlier]:
    figures = link_figures(samples)
    rule, slow = RULES["link"], RULES["latency"]
    named = set(outliers(figures.inbound, rule) + outliers(figures.outbound, rule))
    late = set(outliers(figures.latency, slow))
    found = []
    for host in figures.outbound:
        if host in named:
            middle = statistics.median([*figures.inbound.values(), *figures.outbound.values()])
            inbound, outbound = figures.inbound[host], figures.outbound[host]
            partners = _slow_with(host, samples, middle, rule)
            with_whom = f" (slow with {_names(partners)})" if partners else ""
            text = f"link {size(inbound)} in, {size(outbound)} out; median {size(middle)}{with_whom}"
            found.append(Outlier(host, "link", min(inbound, outbound), middle, UNITS["link"], text))
        if host in late:
            middle = spread(figures.latency).median
            value = figures.latency[host]
            text = f"latency {seconds(value)}; median {seconds(middle)}"
            found.append(Outlier(host, "latency", value, middle, UNITS["latency"], text))
    return found


def judge(hosts: Sequence[HostFigures], samples: Sequence[LinkSample]) -> list[Outlier]:
    """Every outlier, host by host in the order given: compute (CPU hosts), each GPU, intra-host, links."""
    found: list[Outlier] = []
    cpu = {h.host: h.compute_gflops for h in hosts if h.compute_gflops is not None and not h.gpus}
    for host in outliers(cpu, RULES["compute"]):
        middle = spread(cpu).median
        text = f"compute {cpu[host]:.1f} GFLOP/s; median {middle:.1f} GFLOP/s"
        found.append(Outlier(host, "compute", cpu[host], middle, UNITS["compute"], text))
    gpus = {(h.host, g.index): g for h in hosts for g in h.gpus}
    tflops = {f"{host}:{index}": g.tflops for (host, index), g in gpus.items()}
    for key in outliers(tflops, RULES["gpu"]):
        host, index = key.rsplit(":", 1)
        g, middle = gpus[(host, int(index))], spread(tflops).median
        text = f"GPU {index} ({g.name}) {g.tflops:.1f} TFLOP/s {g.dtype}; median {middle:.1f} TFLOP/s"
        found.append(Outlier(host, "gpu", g.tflops, middle, UNITS["gpu"], text))
    intra = {h.host: h.intra_host_bps for h in hosts if h.intra_host_bps is not None}
    for host in outliers(intra, RULES["intra-host"]):
        middle = spread(intra).median
        text = f"intra-host all-reduce {size(intra[host])}; median {size(middle)}"
        found.append(Outlier(host, "intra-host", intra[host], middle, UNITS["intra-host"], text))
    found += _link_outliers(samples)
    order = {h.host: i for i, h in enumerate(hosts)}
    return sorted(found, key=lambda o: order.get(o.host, len(order)))


def _cell(value: float | None, show: Any) -> str:
    return "-" if value is None else str(show(value))


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


PERF_HEADER = ("host", "compute", "intra-host", "link in", "link out", "latency")


def perf_rows(hosts: Sequence[HostFigures], samples: Sequence[LinkSample]) -> list[tuple[str, ...]]:
    """A row per host, then the median of every column."""
    figures = link_figures(samples)

    def compute(h: HostFigures) -> str:
        if h.gpus:
            return f"{min(g.tflops for g in h.gpus):.1f}-{max(g.tflops for g in h.gpus):.1f} TFLOP/s"
        return _cell(h.compute_gflops, lambda v: f"{v:.1f} GFLOP/s")

    rows: list[tuple[str, ...]] = [
        (
            h.host,
            compute(h),
            _cell(h.intra_host_bps, size),
            _cell(figures.inbound.get(h.host), size),
            _cell(figures.outbound.get(h.host), size),
            _cell(figures.latency.get(h.host), seconds),
        )
        for h in hosts
    ]
    gpu_median = _median(g.tflops for h in hosts for g in h.gpus)
    cpu_median = _median(h.compute_gflops for h in hosts if not h.gpus)
    compute_median = (
        f"{gpu_median:.1f} TFLOP/s"
        if gpu_median is not None
        else _cell(cpu_median, lambda v: f"{v:.1f} GFLOP/s")
    )
    rows.append(
        (
            "median",
            compute_median,
            _cell(_median(h.intra_host_bps for h in hosts), size),
            _cell(_median(figures.inbound.values()), size),
            _cell(_median(figures.outbound.values()), size),
            _cell(_median(figures.latency.values()), seconds),
        )
    )
    return rows


def bad_cells(outlier: Outlier) -> tuple[int, ...]:
    """Which columns of PERF_HEADER an outlier's figures are in (coloured on a terminal)."""
    return {"compute": (1,), "gpu": (1,), "intra-host": (2,), "link": (3, 4), "latency": (5,)}[outlier.kind]


def figures_record(
    hosts: Sequence[HostFigures], samples: Sequence[LinkSample], found: Sequence[Outlier]
) -> dict[str, Any]:
    """The report's `perf` object (docs/report.schema.json), less what the orchestration adds."""
    figures = link_figures(samples)
    return {
        "hosts": [
            {
                "host": h.host,
                "backend": h.backend,
                "compute_gflops": h.compute_gflops,
                "gpus": [
                    {"index": g.index, "name": g.name, "dtype": g.dtype, "tflops": g.tflops} for g in h.gpus
                ],
                "intra_host_bps": h.intra_host_bps,
                "link_in_bps": figures.inbound.get(h.host),
                "link_out_bps": figures.outbound.get(h.host),
                "latency_s": figures.latency.get(h.host),
            }
            for h in hosts
        ],
        "links": [
            {
                "hosts": [s.a, s.b],
                "out_bps": [s.a_out, s.b_out],
                "latency_s": s.latency_s,
                "retest": s.retest,
            }
            for s in samples
        ],
        "outliers": [o.record() for o in found],
    }
