"""What distrun writes besides the console, the report, the stacks files and `-v` logs, hides the secrets the
console hides (issue 27, item 5): every string of a report is walked, keys included."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import clean_env, run_distrun

TOKEN = "tok-9f8e7d6c5b"
PASSWORD = "pw-hunter2222"


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON document: keys and values, at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def _secret_free(text: str) -> bool:
    return TOKEN not in text and PASSWORD not in text


def test_a_failing_ranks_secret_is_redacted_in_the_report_as_on_the_console(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    env = clean_env(MY_TOKEN=TOKEN, DB_URL=f"postgres://me:{PASSWORD}@db/x")
    result = run_distrun(
        "-x", "MY_TOKEN", "-x", "DB_URL", "--report", report, "-v", "sh", "-c",
        'echo "auth failed with token $MY_TOKEN at $DB_URL" >&2; exit 3',
        env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr.decode()
    console = result.stderr.decode()
    assert "last stderr lines of rank 0:" in console and _secret_free(console.split("last stderr lines")[1])
    document = json.loads(report.read_text())
    assert document["failure"]["stderr_tail"] == [
        "auth failed with token <redacted> at postgres://me:<redacted>@db/x"
    ]
    leaked = [s for s in strings(document) if not _secret_free(s)]
    assert leaked == []


def test_stacks_files_answers_and_report_are_scrubbed(tmp_path: Path) -> None:
    """A secret where stacks show it (the script's directory is named after it): the stacks on the console,
    in --output-dir's file and in the report hide it."""
    where = tmp_path / TOKEN
    where.mkdir()
    (where / "hang.py").write_text("import time\n\ndef wait_here():\n    time.sleep(60)\n\nwait_here()\n")
    report, out = tmp_path / "r.json", tmp_path / "out"
    result = run_distrun(
        "-x", f"API_TOKEN={TOKEN}", "--timeout", "3", "--stack-tool", "python", "--report", report,
        "--output-dir", out, sys.executable, where / "hang.py",
        env=clean_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 124, result.stderr.decode()
    console = result.stderr.decode()
    assert "wait_here" in console and f"{tmp_path}/<redacted>/hang.py" in console, console
    assert _secret_free(console)
    (stacks,) = out.glob("stacks-*.txt")
    assert "wait_here" in stacks.read_text() and _secret_free(stacks.read_text())
    document = json.loads(report.read_text())
    assert document["stacks"] and [s for s in strings(document) if not _secret_free(s)] == []
