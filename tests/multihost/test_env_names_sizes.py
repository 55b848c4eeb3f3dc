"""Environment names and sizes over SSH (issue 31, items 5 and 7; on this machine:
tests/integration/test_env_limits.py): names that are not identifiers reach remote ranks as local ones, and
--dry-run shows them; a value no process can be given is named before any host is reached."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, run_distrun

pytestmark = pytest.mark.multihost

NAMES = {"GRÜSS": "hallo", "my.var": "1", "X-Y": "2"}


def launch(cluster: Cluster, *args: str | os.PathLike[str], **env: str):  # type: ignore[no-untyped-def]
    return run_distrun(*args, env=cluster.env(PYTHONPATH=str(REPO), **env), timeout=120)


def test_names_that_are_not_identifiers_reach_remote_ranks(cluster: Cluster, tmp_path: Path) -> None:
    hosts = ("-H", "localhost:1,h1:1,h2:1")
    result = launch(cluster, *hosts, SCRIPTS / "envdump.py", tmp_path, **NAMES)
    assert result.returncode == 0, result.stderr.decode()
    for rank in range(3):
        got = json.loads((tmp_path / f"{rank}.json").read_text())["env"]
        assert {name: got.get(name) for name in NAMES} == NAMES, f"rank {rank}"
    shown = launch(cluster, "--dry-run", *hosts, "true", **NAMES).stdout.decode().splitlines()
    for name, value in NAMES.items():
        assert f"    {name}={value}" in shown


def test_a_value_over_the_limit_is_refused_before_any_host_is_reached(
    cluster: Cluster, tmp_path: Path
) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(f"BIG={'x' * 200_000}\n")
    result = launch(
        cluster, "-H", "h1:1,h2:1", "--env-file", env_file, "-v", SCRIPTS / "envdump.py", tmp_path
    )
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert err == (
        f"distrun: error: {env_file}:1: BIG: is 200004 bytes as BIG=VALUE, over the kernel's limit of 131071 "
        "for one environment variable (MAX_ARG_STRLEN); pass so large a value in a file\n"
    )
    assert not list(tmp_path.glob("*.json")), "no rank started"
