"""Detached descendants of ranks on SSH hosts end when distrun is stopped, as on this machine (issue 19,
defect 5). That they end with the job: the `where` cases of tests/integration/test_detached.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import (
    REPO,
    SCRIPTS,
    assert_all_gone,
    recorded_pids,
    start_distrun,
    wait_for_files,
)

pytestmark = pytest.mark.multihost

DETACH = SCRIPTS / "detach.py"


def test_detached_descendants_on_every_host_end_when_distrun_is_stopped(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = cluster.env(PYTHONPATH=str(REPO))
    proc = start_distrun("-H", "h1:1,h2:1", "--grace-period", "1", DETACH, tmp_path, "--wait", env=env)
    wait_for_files(tmp_path, "*.ready", 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert_all_gone(recorded_pids(tmp_path), within=2.0)
    assert cluster.wait_clean(timeout=5.0) == {}
