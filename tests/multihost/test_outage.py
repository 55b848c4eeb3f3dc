"""A network outage against the heartbeat limit (issue 27, item 6): a host is lost after `--ssh-keepalive` x 5
seconds of silence, and an outage shorter than that is survived, although TCP's retransmission back-off after
it (RTO doubling) holds both sides' first bytes back for up to about as long again."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, never_left_running, start_distrun, wait_until

pytestmark = pytest.mark.multihost


def _running_job(
    lab: Cluster, pid_dir: Path, *options: str, sleep: float
) -> tuple[subprocess.Popen[bytes], float]:
    proc = start_distrun(
        "-H", "h1:1,h2:1", *options, SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--after", "0",
        "--sleep", str(sleep), env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    wait_until(lambda: len(list(pid_dir.glob("rank*.pid"))) == 2, timeout=60, what="both ranks started")
    return proc, time.monotonic()


def test_an_outage_shorter_than_the_limit_is_survived(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """7.5 s of the default 10 s: before, TCP's back-off (the next retransmission 12.6 s after the first lost
    one) made it 13 s of silence to one side or the other in about half the runs."""
    lab = make_cluster(2)
    proc, _ = _running_job(lab, tmp_path, sleep=14)
    with never_left_running(proc):
        lab.link_down("h2")
        try:
            time.sleep(7.5)  # the outage itself: no event to wait for
        finally:
            lab.link_up("h2")
        _, err = proc.communicate(timeout=60)
    said = err.decode()
    assert proc.returncode == 0, said
    assert "lost host" not in said, said


def test_an_outage_longer_than_the_limit_loses_the_host(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """--ssh-keepalive 1: lost after 5 s. Cut for 9 s: distrun names the host as silent, the other host stops,
    and once the network is back the cut-off host's agent has stopped its ranks too."""
    lab = make_cluster(2)
    proc, _ = _running_job(lab, tmp_path, "--ssh-keepalive", "1", sleep=60)
    with never_left_running(proc):
        lab.link_down("h2")
        cut = time.monotonic()
        try:
            _, err = proc.communicate(timeout=30)
            ended = time.monotonic() - cut
            time.sleep(max(0.0, 9.0 - ended))
        finally:
            lab.link_up("h2")
    said = err.decode()
    assert proc.returncode == 3, said
    assert re.search(r"lost host h2 \(no word from it for [5-8]s\)", said), said
    # The 5 s count from the last word heard, up to one keepalive (1 s) before the cut.
    assert 4.0 <= ended < 9.0, f"distrun ended {ended:.1f}s after the cut"
    assert lab.wait_clean(timeout=30.0) == {}, "the cut-off agent stopped its ranks (EOF or its own limit)"
