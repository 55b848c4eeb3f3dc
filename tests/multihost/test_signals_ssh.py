"""SIGUSR1 reaches the ranks on every host of the simulated cluster.

Ctrl-C there: the `where` cases of tests/integration/test_signals.py."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, read_until, start_distrun, wait_for_files

pytestmark = pytest.mark.multihost


def _start(cluster: Cluster, pid_dir: Path, *script_args: str) -> subprocess.Popen[bytes]:
    env = cluster.env(PYTHONPATH=str(REPO))
    proc = start_distrun("-H", "h1:1,h2:1", SCRIPTS / "signals.py", pid_dir, *script_args, env=env)
    wait_for_files(pid_dir, "rank*.pid", 2)
    read_until(proc, b"ready", 2)
    return proc


def test_sigusr1_reaches_ranks_on_every_host(cluster: Cluster, tmp_path: Path) -> None:
    proc = _start(cluster, tmp_path, "--exit-on-usr1")
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert b"[0] rank 0 got SIGUSR1" in out and b"[1] rank 1 got SIGUSR1" in out
