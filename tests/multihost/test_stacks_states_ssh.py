"""issue 27 on SSH hosts of the simulated cluster: a remote agent killed with SIGKILL leaves a dump directory
that the next agent started there removes (item 8). Items 10 and 12 on two hosts: the `where` cases of
tests/integration/test_stacks_states.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import (
    SCRIPTS,
    never_left_running,
    sleeping_rank,
    start_distrun,
    wait_for_files,
    wait_until,
)

pytestmark = pytest.mark.multihost


def _env(cluster: Cluster, tmp_path: Path) -> dict[str, str]:
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return cluster.env(XDG_RUNTIME_DIR=str(runtime))


def test_a_remote_agent_killed_with_sigkill_leaves_nothing_after_the_next_start(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = _env(cluster, tmp_path)
    ready = tmp_path / "killed"
    ready.mkdir()
    job = start_distrun("-H", "h2:1", SCRIPTS / "stack_cases.py", ready, "sleep", env=env)
    with never_left_running(job):
        dump_dir, rank, agent = sleeping_rank(ready)
        os.kill(agent, signal.SIGKILL)
        job.communicate(timeout=60)
    assert job.returncode == 3
    wait_until(
        lambda: not Path(f"/proc/{rank}").exists() or "Z" in Path(f"/proc/{rank}/stat").read_text(), 30
    )
    assert dump_dir.exists(), "what SIGKILL leaves"
    again = tmp_path / "again"
    again.mkdir()
    job = start_distrun("-H", "h2:1", SCRIPTS / "stack_cases.py", again, "sleep", env=env)
    with never_left_running(job):
        wait_for_files(again, "*.pid", 1)
        assert not dump_dir.exists(), "the next agent on the host removed it"
    assert cluster.wait_clean(timeout=10) == {}
