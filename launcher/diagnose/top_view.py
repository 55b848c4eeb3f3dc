"""How `distrun top` and the console's status area show the live view: the table, the host lines (pure).

Rows are the JSON objects `LiveView.rows` makes (the job answers `distrun top` with them), so the job and the
client, which runs in another process, format from the same values.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

Row = Mapping[str, object]

_HEADER = ("RANK", "HOST", "STATE", "STEP RATE", "CPU%", "RSS", "GPU%", "GPU MEM", "LAST OUT", "COLL #", "")
_RIGHT = {0, 3, 4, 5, 6, 7, 8, 9}  # figures are right-aligned
_RED, _YELLOW, _BOLD, _DIM, _RESET = "\x1b[31m", "\x1b[33m", "\x1b[1m", "\x1b[2m", "\x1b[0m"


def _number(row: Row, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def memory(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit in ("B", "KiB", "MiB") else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def rate(row: Row) -> str:
    """Steps per second from its progress bar, else lines per second of output."""
    steps = _number(row, "steps_per_s")
    if steps is not None:
        return f"{steps:.3g} it/s"
    lines = _number(row, "lines_per_s")
    return "-" if lines is None else f"{lines:.3g} l/s"


def age(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}s" if value < 60 else f"{value / 60:.0f}m"


def collective(row: Row) -> str:
    """The sequence number of the rank's last collective done, and `+N` issued past it (pending)."""
    done, issued = _number(row, "collective_done"), _number(row, "collective_issued")
    if done is None or issued is None:
        return "-"
    return f"{done:.0f}" + (f" +{issued - done:.0f}" if issued > done else "")


def note(row: Row) -> str:
    """What marks the row: a straggler (the straggler rule), a rank behind the others' collectives, a stopped
    or silent rank."""
    if row.get("straggler"):
        return "straggler"
    behind = _number(row, "collectives_behind")
    if behind:
        return f"{behind:.0f} behind"
    state = str(row.get("state", ""))
    return state if state in ("stopped", "silent") else ""


def _cells(row: Row, host: str) -> tuple[str, ...]:
    return (
        str(row.get("rank")),
        host,
        str(row.get("state", "")),
        rate(row),
        percent(_number(row, "cpu_percent")),
        memory(_number(row, "rss_bytes")),
        percent(_number(row, "gpu_util_percent")),
        memory(_number(row, "gpu_memory_bytes")),
        age(_number(row, "last_output_age_s")),
        collective(row),
        note(row),
    )


def _sum(rows: Sequence[Row], key: str) -> float | None:
    values = [v for v in (_number(r, key) for r in rows) if v is not None]
    return sum(values) if values else None


def _total(host: str, rows: Sequence[Row]) -> tuple[str, ...]:
    gpu = [v for v in (_number(r, "gpu_util_percent") for r in rows) if v is not None]
    steps = _sum(rows, "steps_per_s")
    current = len([r for r in rows if not r.get("left")])
    return (
        "",
        f"{host} total",
        f"{current} ranks" if current != 1 else "1 rank",
        "-" if steps is None else f"{steps:.3g} it/s",
        percent(_sum(rows, "cpu_percent")),
        memory(_sum(rows, "rss_bytes")),
        percent(statistics.mean(gpu) if gpu else None),
        memory(_sum(rows, "gpu_memory_bytes")),
        "",
        "",
        "",
    )


def by_host(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows grouped by host, hosts in the order of their first rank."""
    grouped: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda r: _number(r, "rank") or 0):
        grouped.setdefault(str(row.get("host")), []).append(row)
    return grouped


def table(rows: Sequence[Row], *, color: bool = False, width: int | None = None) -> list[str]:
    """One line per rank grouped by host, each host followed by its totals; aligned columns."""
    lines: list[tuple[tuple[str, ...], str]] = [(_HEADER, _BOLD)]
    for host, ranks in by_host(rows).items():
        for i, row in enumerate(ranks):
            marked = note(row)
            failed = (
                str(row.get("state", "")).startswith(("killed", "exited")) and row.get("state") != "exited 0"
            )
            style = _RED if row.get("straggler") or failed else _YELLOW if marked else ""
            if not style and row.get("left"):
                style = _DIM
            lines.append((_cells(row, host if i == 0 else ""), style))
        lines.append((_total(host, ranks), _DIM))
    widths = [max(len(cells[i]) for cells, _ in lines) for i in range(len(_HEADER))]
    out = []
    for cells, style in lines:
        text = "  ".join(
            cell.rjust(w) if i in _RIGHT else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()
        if width is not None:
            text = text[: max(0, width - 1)]
        out.append(f"{style}{text}{_RESET}" if color and style else text)
    return out


def heading(document: Mapping[str, object]) -> str:
    """`distrun job 123: running its ranks; attempt 0; 4 ranks on 2 hosts; sampled every 2s`."""
    rows = document.get("ranks")
    listed = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    ranks = [r for r in listed if not r.get("left")]  # the world now: not the ranks that left it at a reset
    hosts = len({str(r.get("host")) for r in ranks})
    parts = [f"distrun job {document.get('pid')}: {document.get('doing')}"]
    if listed:
        parts.append(f"attempt {document.get('attempt', 0)}")
        parts.append(
            f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''} on {hosts} host{'s' if hosts != 1 else ''}"
        )
        if len(listed) > len(ranks):
            parts.append(f"{len(listed) - len(ranks)} left at resets")
    interval = document.get("interval")
    if isinstance(interval, int | float) and interval > 0:
        parts.append(f"sampled every {interval:g}s")
    elif ranks:
        parts.append("no sampling (--sample-interval 0)")
    return "; ".join(parts)


def host_summary(host: str, rows: Sequence[Row]) -> str:
    """One host in a line: the lowest and median GPU utilisation (CPU where no GPU is seen), the highest
    memory and its rank, the slowest rank by step rate."""
    gpu = [(v, r) for r in rows if (v := _number(r, "gpu_util_percent")) is not None]
    use, what = (
        (gpu, "GPU")
        if gpu
        else ([(v, r) for r in rows if (v := _number(r, "cpu_percent")) is not None], "CPU")
    )
    parts = [host + ":"]
    if use:
        values = [v for v, _ in use]
        parts.append(f"{what} min {min(values):.0f}% median {statistics.median(values):.0f}%")
    key, label = ("gpu_memory_bytes", "GPU mem") if gpu else ("rss_bytes", "RSS")
    held = [(v, r) for r in rows if (v := _number(r, key)) is not None]
    if held:
        value, row = max(held, key=lambda pair: pair[0])
        parts.append(f"{label} max {memory(value)} (rank {row.get('rank')})")
    rates = [(v, r) for r in rows if (v := _number(r, "steps_per_s")) is not None]
    if rates:
        value, row = min(rates, key=lambda pair: pair[0])
        parts.append(f"slowest rank {row.get('rank')} ({value:.3g} it/s)")
    return "  ".join(parts) if len(parts) > 1 else f"{host}: no samples yet"
