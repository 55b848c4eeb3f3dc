"""issue 27 on SSH hosts of the simulated cluster: ranks recursing from different callers on two hosts are two
groups (item 10), a stopped remote rank is named at once (item 12), and a remote agent killed with SIGKILL
leaves a dump directory that the next agent started there removes (item 8)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import (
    SCRIPTS,
    ask_stacks_until,
    never_left_running,
    start_distrun,
    wait_for_files,
    wait_until,
)

pytestmark = pytest.mark.multihost


def _env(cluster: Cluster, tmp_path: Path) -> dict[str, str]:
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return cluster.env(XDG_RUNTIME_DIR=str(runtime))


def test_deep_recursions_from_two_callers_on_two_hosts_are_two_groups(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = _env(cluster, tmp_path)
    job = start_distrun(
        "-H", "h1:1,h2:1", "--stack-tool", "python", SCRIPTS / "stack_cases.py", tmp_path, "deep", env=env
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        shown = ask_stacks_until(job.pid, "different places", env)
    assert "rank 0 (1 of 2) on h1:" in shown and "rank 1 (1 of 2) on h2:" in shown, shown
    assert shown.count(", in from_left") == 1 and shown.count(", in from_right") == 1, shown
    assert "frames not shown (in walk)" in shown and "stacks cut" not in shown, shown
    assert cluster.wait_clean(timeout=10) == {}


def test_a_stopped_rank_on_a_remote_host_is_named_at_once(cluster: Cluster, tmp_path: Path) -> None:
    env = _env(cluster, tmp_path)
    job = start_distrun(
        "-H", "h1:1,h2:1", "--stack-tool", "python", "--grace-period", "1", SCRIPTS / "stack_cases.py",
        tmp_path, "stopped", env=env,
    )  # fmt: skip
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 2)
        started = time.monotonic()
        shown = ask_stacks_until(job.pid, "it is stopped", env)
        took = time.monotonic() - started
    assert "rank 1 (1 of 2) on h2: cannot read the stacks: it is stopped (SIGSTOP or SIGTSTP" in shown, shown
    assert took < 10, f"took {took:.1f}s"
    assert cluster.wait_clean(timeout=10) == {}


def test_a_remote_agent_killed_with_sigkill_leaves_nothing_after_the_next_start(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = _env(cluster, tmp_path)
    ready = tmp_path / "killed"
    ready.mkdir()
    job = start_distrun("-H", "h2:1", SCRIPTS / "stack_cases.py", ready, "sleep", env=env)
    with never_left_running(job):
        wait_for_files(ready, "*.pid", 1)
        dump_dir = Path((ready / "0.dir").read_text())
        rank = int((ready / "0.pid").read_text())
        agent = int(Path(f"/proc/{rank}/stat").read_text().rpartition(")")[2].split()[1])
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
