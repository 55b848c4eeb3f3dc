"""Ctrl-C and SIGUSR1 reach the ranks on every host of the simulated cluster."""

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


def test_ctrl_c_reaches_ranks_on_every_host_as_sigint(cluster: Cluster, tmp_path: Path) -> None:
    proc = _start(cluster, tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"[0] rank 0 cleaning up after KeyboardInterrupt" in out
    assert b"[1] rank 1 cleaning up after KeyboardInterrupt" in out
    left = cluster.wait_clean(timeout=5.0)
    assert left == {}, left


def test_sigusr1_reaches_ranks_on_every_host(cluster: Cluster, tmp_path: Path) -> None:
    proc = _start(cluster, tmp_path, "--exit-on-usr1")
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert b"[0] rank 0 got SIGUSR1" in out and b"[1] rank 1 got SIGUSR1" in out
