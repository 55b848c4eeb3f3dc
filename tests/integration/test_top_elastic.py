"""`distrun top` after an elastic reset in place, on local ranks: the world now, not the attempt's first one.
A newcomer is listed with its rank in the world, the heading counts the ranks and hosts of the world, and the
ranks that left it (lost, or told to leave by the discovery script) are marked as left, not `exited 0`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import (
    SCRIPTS,
    clean_env,
    distrun_argv,
    never_left_running,
    start_distrun,
    wait_for_files,
    wait_until,
)
from tests.top_helpers import top_json

SCRIPT = SCRIPTS / "elastic_train.py"


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    """A control directory of the test's own: only this test's job is found."""
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


def _heading(pid: int, env: dict[str, str]) -> str:
    done = subprocess.run(distrun_argv("top", "--once", "--job", str(pid)), capture_output=True, env=env,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().splitlines()[0]


def _world(pid: int, env: dict[str, str], want: dict[int, str]) -> dict[int, dict[str, object]]:
    """top's rows once each rank id of `want` is in the state given ("running", "left", ...)."""

    def shown() -> dict[int, dict[str, object]] | None:
        rows = top_json(pid, env)
        return rows if {rank: row["state"] for rank, row in rows.items()} == want else None

    return wait_until(shown, timeout=120, what=f"top to show {want}", every=0.2)


def test_top_after_a_newcomer_joined_lists_the_world_now(tmp_path: Path, runtime: Path) -> None:
    env = clean_env(XDG_RUNTIME_DIR=str(runtime), ELASTIC_SLOW_S="0.2")
    # Start rank 2 is killed at batch 2; a free slot refills the world with a newcomer (id 3, rank 2).
    job = start_distrun("-H", "localhost:4", "-np", "3", "--min-np", "2", SCRIPT, tmp_path, "2", "2", "1000",
                        env=env)  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.start", 4, timeout=120)
        want = {0: "running", 1: "running", 2: "left (killed SIGKILL)", 3: "running"}
        rows = _world(job.pid, env, want)
        assert {rank: row["world_rank"] for rank, row in rows.items()} == {0: 0, 1: 1, 2: None, 3: 2}
        assert [rank for rank, row in rows.items() if row["left"]] == [2]
        assert rows[2]["cpu_percent"] is None, "a rank that left has no figures"
        heading = _heading(job.pid, env)
        assert "3 ranks on 1 host" in heading and "1 left at resets" in heading, heading
        assert job.poll() is None, "the job still runs"


def test_top_after_a_shrink_from_4_to_2_counts_2_and_marks_the_others_left(
    tmp_path: Path, runtime: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\n[ -f {out}/opted.3 ] && echo localhost:2 || echo localhost:4\n")
    script.chmod(0o755)
    env = clean_env(XDG_RUNTIME_DIR=str(runtime), ELASTIC_SLOW_S="0.2", ELASTIC_WAIT_FOR_HOSTS="1")
    job = start_distrun("-np", "4", "--min-np", "1", "--host-discovery-script", script, SCRIPT, out, "-1",
                        "3", "1000", env=env)  # fmt: skip
    with never_left_running(job):
        wait_for_files(out, "opted.*", 4, timeout=120)
        rows = _world(job.pid, env, {0: "running", 1: "running", 2: "left", 3: "left"})
        assert {rank: row["world_rank"] for rank, row in rows.items()} == {0: 0, 1: 1, 2: None, 3: None}
        heading = _heading(job.pid, env)
        assert "2 ranks on 1 host" in heading and "2 left at resets" in heading, heading
        table = subprocess.run(distrun_argv("top", "--once", "--job", str(job.pid)), capture_output=True,
                               env=env, timeout=30).stdout.decode()  # fmt: skip
        assert "exited 0" not in table and "localhost total  2 ranks" in table, table
