"""The end-of-run account across hosts: the table for a 3-host run, and --report measured on each host."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, run_distrun

pytestmark = pytest.mark.multihost


def test_three_host_run_prints_the_table_and_reports(cluster: Cluster, tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    result = run_distrun(
        "-H", "h1:2,h2:1,h3:1", "--report", report, SCRIPTS / "allreduce.py",
        env=cluster.env(PYTHONPATH=str(REPO)), timeout=180,
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    table = [line.removeprefix("distrun: ") for line in err.splitlines() if line.startswith("distrun: ")]
    assert table[0].split() == ["host", "rank", "exit", "wall", "peak", "RSS", "CPU"]
    assert len(table) == 5
    assert table[1].split()[:3] == ["h1", "0", "0"]
    assert table[2].startswith(" ") and table[2].split()[:2] == ["1", "0"], "the host is named once"
    assert table[3].split()[:3] == ["h2", "2", "0"]
    assert table[4].split()[:3] == ["h3", "3", "0"]
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, json.loads((REPO / "docs" / "report.schema.json").read_text()))
    assert [(r["rank"], r["host"], r["exit_code"]) for r in doc["ranks"]] == [
        (0, "h1", 0), (1, "h1", 0), (2, "h2", 0), (3, "h3", 0),
    ]  # fmt: skip
    # Measured by each host's agent: a torch process holds well over 50 MB and used some CPU.
    assert all(r["peak_rss_bytes"] > 50 << 20 and r["cpu_seconds"] > 0 and r["pid"] > 0 for r in doc["ranks"])
