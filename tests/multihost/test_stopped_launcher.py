"""distrun itself stopped (SIGSTOP, not Ctrl-Z: it cannot tell the agents) and continued: it blames no host
for its own silence, and relays the output the ranks had sent meanwhile (issue 19, defect 4)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, read_until, start_distrun

pytestmark = pytest.mark.multihost

# Numbered lines every 20 ms until stopped.
COUNTER = """
import itertools, time
for i in itertools.count():
    print(f"line {i}", flush=True)
    time.sleep(0.02)
"""


def _numbers(out: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"\] line (\d+)\n", out)]


def _stop_for(proc: subprocess.Popen[bytes], seconds: float) -> None:
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(seconds)  # the point: distrun does not run for this long
    os.kill(proc.pid, signal.SIGCONT)


def test_stopped_longer_than_the_agents_wait_blames_no_host(cluster: Cluster, tmp_path: Path) -> None:
    """--ssh-keepalive 1: agents wait 5 s for distrun, which is stopped for 8 s; they stop their ranks."""
    env = cluster.env(PYTHONPATH=str(REPO))
    proc = start_distrun("-H", "h1:1", "--ssh-keepalive", "1", "python", "-c", COUNTER, env=env)
    before = read_until(proc, b"line 10\n", 1)
    _stop_for(proc, 8.0)
    out, err = proc.communicate(timeout=60)
    said = err.decode()
    numbers = _numbers(before + out)
    assert proc.returncode == 3, said
    assert "lost host" not in said, said
    assert "host h1 stopped its ranks: distrun itself did not run for" in said, said
    assert numbers == list(range(len(numbers))), "a line was lost or repeated"
    # The rank went on writing for the 5 s the agent waited (250 lines on an idle machine): that output got
    # to the console, not only what distrun had read before it was stopped.
    assert numbers[-1] >= 10 + 30, f"only {numbers[-1]} lines: what the rank wrote while distrun was stopped"
    assert cluster.wait_clean(timeout=10.0) == {}


def test_stopped_shorter_than_the_agents_wait_goes_on(cluster: Cluster, tmp_path: Path) -> None:
    env = cluster.env(PYTHONPATH=str(REPO))
    script = COUNTER.replace("itertools.count()", "range(400)")
    proc = start_distrun("-H", "h1:1,h2:1", "--ssh-keepalive", "2", "python", "-c", script, env=env)
    before = read_until(proc, b"line 10\n", 2)
    _stop_for(proc, 4.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    for rank in (0, 1):
        lines = re.findall(rb"\[%d\] line (\d+)\n" % rank, before + out)
        assert [int(n) for n in lines] == list(range(400)), f"rank {rank}"
