"""Environment values and names at their limits, on this machine (issue 31, items 5 and 7; over SSH:
tests/multihost/test_env_names_sizes.py): a value no process can be given is named before anything starts;
a name that is not an identifier reaches the rank, and --dry-run shows it as the launch gives it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support import SCRIPTS, clean_env, run_distrun

BIG = "x" * 200_000
LIMIT = "over the kernel's limit of 131071 for one environment variable (MAX_ARG_STRLEN)"
_TOUCH = "import sys; open(sys.argv[1], 'w').close()"


def test_an_env_file_value_over_the_limit_is_refused_before_anything_starts(tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(f"SMALL=1\nBIG={BIG}\n")
    marker = tmp_path / "ran"
    result = run_distrun("--env-file", env_file, "-np", "2", sys.executable, "-c", _TOUCH, marker)
    assert result.returncode == 2
    assert result.stderr.decode() == (
        f"distrun: error: {env_file}:2: BIG: is 200004 bytes as BIG=VALUE, {LIMIT}; pass so large a value "
        "in a file\n"
    )
    assert not marker.exists()


def test_a_config_file_export_over_the_limit_names_its_line(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(f"num-proc: 1\nexport:\n  - BIG={BIG}\n")
    result = run_distrun("--config", config, "true")
    assert result.returncode == 2
    assert result.stderr.decode().startswith(f"distrun: error: {config}:2: export BIG: is 200004 bytes")
    assert result.stderr.decode().count("\n") == 1


def test_a_value_just_under_the_limit_reaches_the_rank(tmp_path: Path) -> None:
    value = "y" * (131071 - len("NEAR="))
    result = run_distrun("-x", f"NEAR={value}", sys.executable, SCRIPTS / "envdump.py", tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert json.loads((tmp_path / "0.json").read_text())["env"]["NEAR"] == value


def test_names_that_are_not_identifiers_reach_the_rank_and_the_dry_run(tmp_path: Path) -> None:
    names = {"GRÜSS": "hallo", "my.var": "1", "X-Y": "2"}
    env = clean_env(**names)
    result = run_distrun(sys.executable, SCRIPTS / "envdump.py", tmp_path, env=env)
    assert result.returncode == 0, result.stderr.decode()
    got = json.loads((tmp_path / "0.json").read_text())["env"]
    assert {name: got.get(name) for name in names} == names
    shown = run_distrun("--dry-run", "true", env=env).stdout.decode().splitlines()
    for name, value in names.items():
        assert f"    {name}={value}" in shown
