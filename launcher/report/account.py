"""The end-of-run account: per-rank exit, wall time, peak RSS and CPU time, as a table and as `--report` JSON.

Pure: the run gives what happened (`RankRecord`s, attempts), this module only formats it. The JSON follows
docs/report.schema.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.agent.protocol import RankExited
    from launcher.core.samples import Point
    from launcher.diagnose.stacks import StackDump
    from launcher.diagnose.stragglers import Reading, Straggler

from launcher.core.scrub import SCRUBBER
from launcher.errors import signal_name
from launcher.report.file import write_whole

REPORT_VERSION = 1


@dataclass(frozen=True)
class Usage:
    """What the agent measured for one rank's process tree (os.wait4: the rank and what it waited for)."""

    wall_s: float
    cpu_s: float
    max_rss_kb: int


@dataclass(frozen=True)
class RankRecord:
    """One rank in one attempt. `returncode` as Popen's (negative: its signal); None: no exit seen."""

    rank: int
    host: str
    pid: int | None = None
    returncode: int | None = None
    usage: Usage | None = None
    log_dir: Path | None = None
    progress: Reading | None = None  # its progress bar's last state, when it drew one
    samples: tuple[Point, ...] = ()  # the agent's samples over the attempt, at most 500 (core.samples)


@dataclass(frozen=True)
class Attempt:
    """One try of the job; the loop around the supervisor makes one per (re)start."""

    number: int
    started: float  # time.time()
    ended: float
    outcome: str  # succeeded, rank-failed, host-lost, signalled, timed-out
    exit_code: int
    ranks: tuple[RankRecord, ...] = ()


@dataclass(frozen=True)
class Failure:
    """What the summary and the report say about one failure."""

    rank: int | None
    host: str | None
    detail: str
    stderr_tail: tuple[str, ...] = field(default_factory=tuple)


def rank_records(
    ranks: Sequence[tuple[int, str]],
    measured: Mapping[int, RankExited],
    progress: Mapping[int, Reading],
    output_dir: Path | None,
    samples: Mapping[int, Sequence[Point]] | None = None,
) -> tuple[RankRecord, ...]:
    """Each (rank, host) of an attempt as its agent measured it (`measured`: RankExited by rank; a rank
    missing there was never seen to exit), with its progress bar's last state, its samples over the attempt
    and its log folder."""
    records = []
    for rank, host in ranks:
        m = measured.get(rank)
        records.append(
            RankRecord(
                rank,
                host,
                pid=(m.pid or None) if m is not None else None,
                returncode=m.returncode if m is not None else None,
                usage=Usage(m.wall_s, m.cpu_s, m.max_rss_kb) if m is not None and m.wall_s else None,
                log_dir=None if output_dir is None else output_dir / f"rank.{rank}",
                progress=progress.get(rank),
                samples=tuple((samples or {}).get(rank, ())),
            )
        )
    return tuple(records)


def killed_by(returncode: int | None) -> str | None:
    """The name of the signal that ended a process with this returncode (Popen's -N); None if none did."""
    if returncode is None or returncode >= 0:
        return None
    return signal_name(-returncode)


def exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "-"
    return killed_by(returncode) or str(returncode)


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(round(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _memory(kb: int) -> str:
    value, unit = float(kb), "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} {unit}" if unit in ("KiB", "MiB") else f"{value:.1f} {unit}"


def format_account(ranks: Sequence[RankRecord]) -> str:
    """One row per rank, grouped by host (the host named on its first row), aligned columns."""
    header: tuple[str, ...] = ("host", "rank", "exit", "wall", "peak RSS", "CPU")
    with_progress = any(r.progress is not None for r in ranks)
    if with_progress:
        header = (*header, "progress")
    rows: list[tuple[str, ...]] = []
    last_host = None
    for record in sorted(ranks, key=lambda r: r.rank):
        usage = record.usage
        rows.append(
            (
                record.host if record.host != last_host else "",
                str(record.rank),
                exit_text(record.returncode),
                _seconds(usage.wall_s) if usage else "-",
                _memory(usage.max_rss_kb) if usage else "-",
                _seconds(usage.cpu_s) if usage else "-",
                *([record.progress.text() if record.progress else "-"] if with_progress else []),
            )
        )
        last_host = record.host
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    # Text left-aligned, numbers right-aligned, so that columns of figures compare at a glance.
    lines = []
    for row in (header, *rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat(timespec="milliseconds")


def _rank_json(record: RankRecord) -> dict[str, Any]:
    usage = record.usage
    logs = None
    if record.log_dir is not None:
        logs = {"stdout": str(record.log_dir / "stdout"), "stderr": str(record.log_dir / "stderr")}
    return {
        "rank": record.rank,
        "host": record.host,
        "pid": record.pid,
        "exit_code": None if record.returncode is None else (
            128 - record.returncode if record.returncode < 0 else record.returncode
        ),
        "signal": killed_by(record.returncode),
        "wall_seconds": None if usage is None else round(usage.wall_s, 3),
        "cpu_seconds": None if usage is None else round(usage.cpu_s, 3),
        "peak_rss_bytes": None if usage is None else usage.max_rss_kb * 1024,
        "logs": logs,
        "progress": None if record.progress is None else {
            "n": record.progress.n, "total": record.progress.total, "rate": record.progress.rate,
        },
        "samples": [point.to_json() for point in record.samples],
    }  # fmt: skip


def build_report(
    *,
    run_id: str,
    command: Sequence[str],
    exit_code: int,
    attempts: Sequence[Attempt],
    failure: Failure | None,
    outcome: str | None = None,
    stacks: Sequence[StackDump] = (),
    stragglers: Sequence[Straggler] = (),
    timeline: Sequence[dict[str, Any]] = (),
    workdir: dict[str, Any] | None = None,
    perf: dict[str, Any] | None = None,
    origin: float | None = None,
    resets: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The `--report` document: the last attempt's ranks at the top level, every attempt in `attempts`;
    `workdir` (with --workdir): the copy's manifest hash, size, and what syncing sent to each host.

    `outcome`: the job's, where it differs from the last attempt's (--timeout during a restart delay).
    `origin`: when distrun started (time.time()), t = 0 of the timeline and of each rank's samples.
    `resets`: an elastic job's resets in place (launcher.job.elastic.ResetRecord.to_json), its `at` on the
    wall clock.
    """
    last = attempts[-1] if attempts else None
    extra: dict[str, Any] = {} if workdir is None else {"workdir": workdir}
    if perf is not None:
        extra["perf"] = perf  # `check --perf`, `--preflight`: launcher.check.perf.PerfResult.record
    if origin is not None:
        extra["origin"] = _iso(origin)
    if resets is not None:
        extra["resets"] = [{**reset, "at": _iso(reset["at"])} for reset in resets]
    return {
        **extra,
        "version": REPORT_VERSION,
        "run_id": run_id,
        "command": list(command),
        "started": _iso(attempts[0].started) if attempts else None,
        "ended": _iso(last.ended) if last else None,
        "exit_code": exit_code,
        "outcome": outcome or (last.outcome if last else "not-started"),
        "restarts": max(0, len(attempts) - 1),
        "ranks": [_rank_json(r) for r in (last.ranks if last else ())],
        "failure": None
        if failure is None
        else {
            "rank": failure.rank,
            "host": failure.host,
            "detail": failure.detail,
            "stderr_tail": list(failure.stderr_tail),
        },
        "attempts": [
            {
                "attempt": a.number,
                "started": _iso(a.started),
                "ended": _iso(a.ended),
                "outcome": a.outcome,
                "exit_code": a.exit_code,
                "ranks": [_rank_json(r) for r in a.ranks],
            }
            for a in attempts
        ],
        "stacks": [dump.to_json() for dump in stacks],
        "timeline": list(timeline),
        "stragglers": [
            {"rank": s.rank, "host": s.host, "ratio": round(s.ratio, 3), "seconds": round(s.seconds, 1)}
            for s in stragglers
        ],
    }


def report_text(report: dict[str, Any]) -> str:
    """The report as written, every string in it scrubbed as the console's words are: a rank's stderr, an
    error or a command may quote a secret."""
    return json.dumps(SCRUBBER.json(report), indent=2) + "\n"


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Written whole or not at all, through a symlink as `>` would (see launcher.report.file)."""
    write_whole(path, report_text(report))
