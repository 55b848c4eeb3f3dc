from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from launcher.report.account import (
    Attempt,
    Failure,
    RankRecord,
    Usage,
    build_report,
    exit_text,
    format_account,
    write_report,
)
from tests.support import REPO

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())


def test_account_table_groups_ranks_by_host() -> None:
    table = format_account(
        [
            RankRecord(2, "h2", 30, -9, Usage(75.0, 70.25, 3 * 1024 * 1024)),
            RankRecord(0, "h1", 10, 0, Usage(12.34, 11.0, 200 * 1024)),
            RankRecord(1, "h1", 11, 1, Usage(3700, 0.5, 900)),
            RankRecord(3, "h3"),
        ]
    )
    assert table.splitlines() == [
        "host  rank     exit   wall  peak RSS    CPU",
        "h1       0        0  12.3s   200 MiB  11.0s",
        "         1        1  1h01m   900 KiB   0.5s",
        "h2       2  SIGKILL  1m15s   3.0 GiB  1m10s",
        "h3       3        -      -         -      -",
    ]


@pytest.mark.parametrize(("code", "text"), [(0, "0"), (3, "3"), (-15, "SIGTERM"), (None, "-")])
def test_exit_text(code: int | None, text: str) -> None:
    assert exit_text(code) == text


def report(**kwargs: object) -> dict[str, object]:
    ranks = (
        RankRecord(0, "h1", 10, 0, Usage(1.0, 0.5, 100), Path("/logs/rank.0")),
        RankRecord(1, "h2", 11, -9),
    )
    attempts = [
        Attempt(0, 1_700_000_000.0, 1_700_000_010.5, "rank-failed", 137, ranks),
        Attempt(1, 1_700_000_011.0, 1_700_000_020.0, "succeeded", 0, ranks[:1]),
    ]
    defaults: dict[str, object] = {
        "run_id": "abc",
        "command": ["python", "train.py"],
        "exit_code": 0,
        "attempts": attempts,
        "failure": None,
    }
    return build_report(**{**defaults, **kwargs})  # type: ignore[arg-type]


def test_report_matches_the_schema() -> None:
    doc = report(failure=Failure(1, "h2", "rank 1 on h2 was killed by SIGKILL", ("oom",)), exit_code=137)
    jsonschema.validate(doc, SCHEMA)
    assert doc["restarts"] == 1
    assert doc["started"] == "2023-11-14T22:13:20.000+00:00"
    first = doc["attempts"][0]["ranks"]  # type: ignore[index]
    assert first[1] == {
        "rank": 1,
        "host": "h2",
        "pid": 11,
        "exit_code": 137,
        "signal": "SIGKILL",
        "wall_seconds": None,
        "cpu_seconds": None,
        "peak_rss_bytes": None,
        "logs": None,
        "progress": None,
        "samples": [],
    }
    assert first[0]["logs"] == {"stdout": "/logs/rank.0/stdout", "stderr": "/logs/rank.0/stderr"}


def test_schema_refuses_what_it_should() -> None:
    doc = report()
    doc["outcome"] = "exploded"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def test_write_report_replaces_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    write_report(path, report())
    assert json.loads(path.read_text())["run_id"] == "abc"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
