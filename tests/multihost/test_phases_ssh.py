"""Phases of the job over SSH (issue 24): the pause before a restart listens to the agents as every other
phase does, so a host that goes silent there is dropped at once and reconnected for the next attempt; while
the hosts are being connected, `distrun stacks` is answered at once."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean
from tests.support import REPO, SCRIPTS, attempt_world, job_answer, start_distrun, wait_until

pytestmark = pytest.mark.multihost

RESTARTABLE = SCRIPTS / "restartable.py"


def _stderr_until(proc: subprocess.Popen[bytes], needle: str) -> str:
    """distrun's stderr, line by line, until a line holds `needle`."""
    assert proc.stderr is not None
    seen = ""
    while needle not in seen:
        line = proc.stderr.readline().decode()
        assert line, f"distrun's stderr ended before {needle!r}: {seen}"
        seen += line
    return seen


def test_a_host_silent_during_the_restart_pause_is_reconnected_for_the_next_attempt(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Silent for keepalive x 5 = 2.5 s: lost well within the 20 s pause.
    proc = start_distrun(
        "-H", "h1:1,h2:1", "--ssh-keepalive", "0.5", "--max-restarts", "1", "--restart-delay", "20",
        RESTARTABLE, "--out", tmp_path, "--fail", "0:0:3",
        env=cluster.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    try:
        _stderr_until(proc, "restarting in 20s")
        cluster.link_down("h2")
        try:
            said = _stderr_until(proc, "host h2: no word from it")
        finally:
            cluster.link_up("h2")
        assert "before the restart; reconnecting it" in said, said
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, rest.decode()
    assert attempt_world(tmp_path, 1) == {0: ("h1", "2"), 1: ("h2", "2")}
    assert_clean(cluster)


def test_distrun_stacks_is_answered_while_the_hosts_are_being_connected(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Before the job's loop runs (SSH handshakes on threads), `distrun stacks` still answers at once."""
    env = cluster.env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(tmp_path))
    cluster.link_down("h2")  # its handshake waits: the connect phase lasts
    try:
        proc = start_distrun("-H", "h1:1,h2:1", "true", env=env)
        try:
            done = wait_until(lambda: job_answer(proc.pid, env), 60, "distrun stacks to reach the job")
            assert done.returncode == 75, done.stderr
            assert "it is starting: connecting to its hosts" in done.stderr
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        cluster.link_up("h2")
    assert proc.returncode == 130, err.decode()
    assert_clean(cluster)
