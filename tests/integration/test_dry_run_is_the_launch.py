"""--dry-run prints the START requests the launch sends: every rank's environment, as the ranks receive it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support import REPO, SCRIPTS, clean_env, run_distrun

SECRET = "tok-4f1d9a"
# What each host's agent appends for `distrun stacks` (launcher.agent.stackdump.DumpDir.rank_env).
HOOKED = {"PYTHONPATH": f"{re.escape(os.pathsep)}.+", "PYTHONWARNINGS": ",.+"}


def dry_run_env(out: str) -> dict[int, dict[str, str]]:
    """Each rank's environment as the dry run shows it: what every rank gets, then the rank's own lines."""
    shared: dict[str, str] = {}
    ranks: dict[int, dict[str, str]] = {}
    current = shared
    for line in out.splitlines():
        if line.startswith("rank "):
            current = ranks[int(line.split()[1].rstrip(":"))] = dict(shared)
        elif line.startswith("    "):
            name, _, value = line.strip().removesuffix("  # unless the host sets it").partition("=")
            current[name] = shlex.split(value)[0] if value else ""
    return ranks


def test_every_rank_receives_what_the_dry_run_shows(tmp_path: Path) -> None:
    env = clean_env(MY_API_TOKEN=SECRET, LR="0.1", OMP_NUM_THREADS="")
    del env["OMP_NUM_THREADS"]  # distrun's default shows, and reaches the ranks
    args = ("-H", "localhost:3", "-x", "MY_API_TOKEN", "-x", "EXTRA=1", "--max-restarts", "2")
    command = (SCRIPTS / "envdump.py", tmp_path)
    dry = run_distrun("--dry-run", *args, *command, env=env)
    assert dry.returncode == 0, dry.stderr
    printed = dry.stdout.decode()
    assert SECRET not in printed  # secrets are redacted in the printout only
    shown = dry_run_env(printed)
    assert sorted(shown) == [0, 1, 2]

    done = run_distrun(*args, *command, env=env)
    assert done.returncode == 0, done.stderr
    for rank, expected in shown.items():
        received = json.loads((tmp_path / f"{rank}.json").read_text())["env"]
        assert received["MY_API_TOKEN"] == SECRET and expected["MY_API_TOKEN"] == "<redacted>"
        assert expected["EXTRA"] == "1" and expected["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert expected["OMP_NUM_THREADS"] == "1"
        for name, value in expected.items():
            if value == "<redacted>":
                continue
            # What only the hosts decide (ports, the run id) shows as "auto".
            pattern = re.escape(value).replace("auto", "[0-9a-f]+")
            if name in HOOKED:  # the agent appends the stack hook, as the dry run says in its own line
                pattern += HOOKED[name]
            assert name in received and re.fullmatch(pattern, received[name]), (rank, name, value)


def test_dry_run_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "--dry-run", "-np", "2", "touch", str(marker)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "rank 1: host=localhost" in result.stdout
    assert not marker.exists()
