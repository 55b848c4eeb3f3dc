"""Restarts and elastic host loss across SSH hosts of the simulated cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean
from tests.support import REPO, SCRIPTS, attempt_world, run_distrun, start_distrun, wait_for_files

pytestmark = pytest.mark.multihost

RESTARTABLE = SCRIPTS / "restartable.py"
# A silent host is declared lost after keepalive x 5: 2.5 s instead of the default 10 s.
FAST_LOSS = ("--ssh-keepalive", "0.5", "--restart-delay", "0")


def _lose_h3_mid_run(lab: Cluster, out: Path, *args: str) -> tuple[int, str]:
    proc = start_distrun(
        "-H", "h1:1,h2:1,h3:1", *FAST_LOSS, *args, RESTARTABLE, "--out", out, "--wait-attempt", "0",
        env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    wait_for_files(out, "a0.r*.pid", 3)
    lab.link_down("h3")
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        lab.link_up("h3")
    return proc.returncode, err.decode()


def test_a_lost_host_leaves_the_job_which_restarts_smaller_and_finishes(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    code, err = _lose_h3_mid_run(lab, tmp_path, "--min-np", "2")
    assert code == 0, err
    assert attempt_world(tmp_path, 1) == {0: ("h1", "2"), 1: ("h2", "2")}
    assert "attempt 0 failed: lost host h3" in err
    assert_clean(lab)


def test_losing_a_host_below_min_np_is_one_clear_line_and_exit_3(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    code, err = _lose_h3_mid_run(lab, tmp_path, "--min-np", "3")
    assert code == 3, err
    assert "distrun: error: only 2 slots left without h3 (h1, h2), fewer than --min-np 3" in err
    assert "Traceback" not in err and not list(tmp_path.glob("a1.*"))
    assert_clean(lab)


def test_a_host_from_the_discovery_script_joins_at_the_next_restart(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho h1:1\necho h2:1\n")
    script.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    result = run_distrun(
        "-H", "h1:1", "--min-np", "1", "--max-np", "2", "--host-discovery-script", script,
        "--restart-delay", "0", RESTARTABLE, "--out", out, "--fail", "0:0:1",
        env=cluster.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert attempt_world(out, 0) == {0: ("h1", "1")}
    assert attempt_world(out, 1) == {0: ("h1", "2"), 1: ("h2", "2")}
    assert_clean(cluster)


def test_a_failed_remote_rank_restarts_the_whole_job_on_every_host(cluster: Cluster, tmp_path: Path) -> None:
    result = run_distrun(
        "-H", "h1:1,h2:1", "--max-restarts", "1", "--restart-delay", "0",
        RESTARTABLE, "--out", tmp_path, "--fail", "0:1:7",
        env=cluster.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert attempt_world(tmp_path, 1) == {0: ("h1", "2"), 1: ("h2", "2")}
    assert_clean(cluster)
