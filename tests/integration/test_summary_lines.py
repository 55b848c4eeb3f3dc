"""Smaller lines of the failure summary and of bad input (issue 31, item 9), from real runs."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support import run_distrun

# Rank 1 leaves only a colour reset and a carriage return on stderr, then is killed by SIGKILL.
_KILLED = """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    sys.stderr.write("\\x1b[0m\\r")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def test_a_rank_with_nothing_visible_on_stderr_gets_no_empty_header() -> None:
    result = run_distrun("-np", "2", sys.executable, "-c", _KILLED, timeout=60)
    err = result.stderr.decode()
    assert result.returncode == 137, err
    assert "distrun: rank 1 (host localhost) was killed by SIGKILL (exit code 137); stopped rank 0" in err
    assert "last stderr lines" not in err


def test_a_missing_env_file_of_a_config_file_names_the_config_line(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("num-proc: 1\nenv-file: missing.env\n")
    result = run_distrun("--config", config, "true")
    assert result.returncode == 2
    assert result.stderr.decode() == (
        f"distrun: error: {config}:2: env-file: cannot read env file {tmp_path / 'missing.env'}: "
        "No such file or directory\n"
    )
