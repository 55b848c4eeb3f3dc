"""`distrun plot`: one picture of a run from its `--report`: step rate, CPU, memory, GPU per rank over time.

Ranks are coloured by host (a hue per host, a shade per rank), restarts are vertical lines (a restart with
another number of ranks says so), each elastic reset in place a dashed one with the world's size before and
after, the start-up timeline is shaded with each phase's last host marked, and stragglers are drawn bold and
named. matplotlib is an optional extra (`distrun[plot]`),
imported only here and only with the Agg backend, so the launcher itself stays light.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.core.samples import Point
from launcher.errors import DistrunError, UsageError

SUFFIXES = (".png", ".svg")
INSTALL = 'pip install "distrun[plot]"'
_PHASES = ("connected", "agent", "probed", "started")


class PlotInputError(UsageError):
    """The report cannot be read as one: missing, not JSON, not a distrun report (exit 2)."""


class PlotExtraMissing(DistrunError):
    """matplotlib is not installed (exit 1): the line says how to install it."""


@dataclass(frozen=True)
class Line:
    """One rank's samples in one attempt."""

    rank: int
    host: str
    attempt: int
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Marker:
    """A labelled moment on the picture's time axis."""

    t: float
    label: str


@dataclass(frozen=True)
class RunPicture:
    """What the picture shows, read from a report (pure: no matplotlib)."""

    title: str
    lines: tuple[Line, ...]
    hosts: tuple[str, ...]
    restarts: tuple[Marker, ...]
    startup: tuple[Marker, ...]
    stragglers: frozenset[int]
    resets: tuple[Marker, ...] = ()


def load_report(path: Path) -> dict[str, Any]:
    """The report at `path`; PlotInputError (one line) when it is missing, not JSON or not a report."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlotInputError(f"plot: {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PlotInputError(
            f"plot: {path}: cannot read it: {getattr(err, 'strerror', None) or err}"
        ) from None
    try:
        report = json.loads(text)
    except ValueError as err:
        raise PlotInputError(f"plot: {path}: not JSON ({err})") from None
    missing = [
        key for key in ("version", "ranks", "attempts") if not isinstance(report, dict) or key not in report
    ]
    if missing:
        raise PlotInputError(f"plot: {path}: not a distrun report (no {', '.join(missing)}; see --report)")
    return dict(report)


def _seconds_between(later: str, earlier: str) -> float:
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


def picture(report: Mapping[str, Any], name: str) -> RunPicture:
    """What to draw from `report` (PlotInputError where its parts are not what a report holds)."""
    try:
        return _picture(report, name)
    except (KeyError, TypeError, ValueError) as err:
        raise PlotInputError(f"plot: {name}: not a distrun report ({type(err).__name__}: {err})") from None


def _picture(report: Mapping[str, Any], name: str) -> RunPicture:
    lines = []
    hosts: dict[str, None] = {}
    attempts = report["attempts"] or [{"attempt": 0, "ranks": report["ranks"]}]
    for attempt in attempts:
        for rank in attempt["ranks"]:
            hosts.setdefault(str(rank["host"]), None)
            points = tuple(Point.from_json(p) for p in rank.get("samples") or ())
            lines.append(Line(int(rank["rank"]), str(rank["host"]), int(attempt["attempt"]), points))
    origin = report.get("origin")
    restarts = []
    if origin:
        for before, attempt in itertools.pairwise(attempts):
            label = f"restart {attempt['attempt']}"
            if len(attempt["ranks"]) != len(before["ranks"]):
                label += f": {len(before['ranks'])} -> {len(attempt['ranks'])} ranks"
            restarts.append(Marker(_seconds_between(attempt["started"], origin), label))
    resets = []
    if origin:
        for number, reset in enumerate(report.get("resets") or (), start=1):
            before = reset.get("size_before")
            sizes = f"{before} -> {reset['size']}" if before is not None else f"-> {reset['size']}"
            resets.append(Marker(_seconds_between(reset["at"], origin), f"reset {number}: {sizes} ranks"))
    startup = []
    timeline = report.get("timeline") or []
    for phase in _PHASES:
        times = [host[phase] for host in timeline if host.get(phase) is not None]
        if times:
            startup.append(Marker(max(times), phase))
    first = [t for host in timeline for t in (host.get("first_output") or {}).values()]
    if first:
        startup.append(Marker(max(first), "first output"))
    command = " ".join(report.get("command") or [])
    ended = f"{report.get('outcome')}, exit {report.get('exit_code')}, run {report.get('run_id')}"
    title = f"{command[:80]}  ({ended})"
    stragglers = frozenset(int(s["rank"]) for s in report.get("stragglers") or ())
    return RunPicture(
        title, tuple(lines), tuple(hosts), tuple(restarts), tuple(startup), stragglers, tuple(resets)
    )


def _colours(hosts: Sequence[str], lines: Sequence[Line]) -> dict[tuple[str, int], Any]:
    """A hue per host, a shade of it per rank on that host."""
    from matplotlib import colormaps

    families = ["Blues", "Oranges", "Greens", "Purples", "Reds", "Greys", "YlOrBr", "PuRd", "BuGn", "RdPu"]
    colours = {}
    for i, host in enumerate(hosts):
        ranks = sorted({line.rank for line in lines if line.host == host})
        cmap = colormaps[families[i % len(families)]]
        for j, rank in enumerate(ranks):
            colours[(host, rank)] = (
                cmap(0.9 - 0.5 * j / max(1, len(ranks) - 1)) if len(ranks) > 1 else cmap(0.8)
            )
    return colours


_PANELS = (
    ("steps_per_s", "steps/s", 1.0),
    ("cpu_percent", "CPU %", 1.0),
    ("rss_bytes", "memory GiB\n(RSS; GPU dashed)", 1 / (1 << 30)),
    ("gpu_util_percent", "GPU %", 1.0),
)


def draw(run: RunPicture, out: Path) -> None:
    """Write the picture to `out` (PNG or SVG, by its suffix)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: a file, from any machine
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotExtraMissing(f"plot needs matplotlib, an optional extra: {INSTALL}") from None
    colours = _colours(run.hosts, run.lines)
    figure, axes = plt.subplots(len(_PANELS), 1, sharex=True, figsize=(10, 9), constrained_layout=True)
    figure.suptitle(run.title, fontsize=9)
    labelled: set[tuple[str, int]] = set()
    for axis, (key, label, scale) in zip(axes, _PANELS, strict=True):
        axis.set_ylabel(label, fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
        drawn = False
        for line in run.lines:
            xs, ys = _values(line.points, key, scale)
            if not xs:
                continue
            drawn = True
            colour = colours[(line.host, line.rank)]
            straggler = line.rank in run.stragglers
            name = (line.host, line.rank)
            # Each rank named once in the legend, by whichever panel draws it first.
            legend = f"{line.host}:{line.rank}" + (" straggler" if straggler else "")
            axis.plot(
                xs, ys, color=colour, linewidth=2.4 if straggler else 1.0,
                label=legend if name not in labelled else None,
            )  # fmt: skip
            labelled.add(name)
            if key == "rss_bytes":
                gx, gy = _values(line.points, "gpu_memory_bytes", scale)
                if gx:
                    axis.plot(gx, gy, color=colour, linewidth=1.0, linestyle="--")
        if not drawn:
            axis.text(
                0.5, 0.5, f"no {label.split()[0]} samples", transform=axis.transAxes, ha="center", alpha=0.6
            )
        for mark in run.restarts:
            axis.axvline(mark.t, color="crimson", linewidth=1.2)
        for mark in run.resets:
            axis.axvline(mark.t, color="darkorange", linewidth=1.2, linestyle="--")
        if run.startup:
            axis.axvspan(0, run.startup[-1].t, color="grey", alpha=0.12, linewidth=0)
    top = axes[0]
    for mark in run.restarts:
        top.annotate(
            mark.label, (mark.t, 1.0), xycoords=("data", "axes fraction"), fontsize=7, color="crimson",
            rotation=90, va="top", ha="right",
        )  # fmt: skip
    for mark in run.resets:
        top.annotate(
            mark.label, (mark.t, 1.0), xycoords=("data", "axes fraction"), fontsize=7, color="darkorange",
            rotation=90, va="top", ha="right",
        )  # fmt: skip
    for mark in run.startup:
        top.axvline(mark.t, color="grey", linewidth=0.6, linestyle=":")
        top.annotate(
            mark.label, (mark.t, 0.02), xycoords=("data", "axes fraction"), fontsize=6, color="dimgrey",
            rotation=90, va="bottom", ha="right",
        )  # fmt: skip
    axes[-1].set_xlabel("seconds since distrun started", fontsize=8)
    handles = [h for axis in axes for h in axis.get_legend_handles_labels()[0]]
    if handles:
        figure.legend(loc="outside right upper", fontsize=7, title="host:rank", title_fontsize=7)
    figure.savefig(out, dpi=90)
    plt.close(figure)


def _values(points: Sequence[Point], key: str, scale: float) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for point in points:
        value = getattr(point, key)
        if value is not None:
            xs.append(point.t)
            ys.append(value * scale)
    return xs, ys


def plot(report_path: Path, out: Path) -> RunPicture:
    """Read the report, draw its picture to `out`; what was drawn."""
    if out.suffix.lower() not in SUFFIXES:
        raise PlotInputError(f"plot: -o {out}: name a .png or .svg file")
    run = picture(load_report(report_path), str(report_path))
    try:
        draw(run, out)
    except OSError as err:
        raise PlotInputError(f"plot: -o {out}: {err.strerror or err}") from None
    return run
