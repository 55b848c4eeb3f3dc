"""distrun on a larger private cluster: the progress line on a real terminal, and nothing of it on a pipe."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator

import pyte
import pytest

from tests.multihost.cluster import Cluster, impossible_reason, missing_tool_reason
from tests.support import REPO, distrun_argv, open_terminal, read_terminal, require_machine, run_distrun

pytestmark = pytest.mark.multihost

HOSTS = 24
ROWS, COLUMNS = 100, 80  # room for the output and the end-of-run account below it


@pytest.fixture(scope="module")
def wide() -> Iterator[Callable[[], Cluster]]:
    """One cluster of HOSTS hosts for this module, built on first use."""
    require_machine(impossible_reason(), missing_tool_reason())
    built: list[Cluster] = []

    def get() -> Cluster:
        if not built:
            built.append(Cluster(HOSTS, login_rc=False))
        return built[0]

    yield get
    for cluster in built:
        cluster.close()


def host_list(cluster: Cluster) -> str:
    return ",".join(f"{h}:1" for h in cluster.hosts)


def test_progress_line_on_a_terminal_is_gone_before_the_output(wide: Callable[[], Cluster]) -> None:
    cluster = wide()
    parent, child = open_terminal(COLUMNS, ROWS)
    proc = subprocess.Popen(
        distrun_argv("-H", host_list(cluster), "--prefix", "host", "hostname"),
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=REPO,
    )
    os.close(child)
    raw = read_terminal(parent)
    os.close(parent)
    assert proc.wait(timeout=120) == 0, raw.decode(errors="replace")
    # Each host's agent starts as soon as its own handshake is done: connecting and starting are one phase.
    phases = [
        f"{phase} {HOSTS}/{HOSTS} hosts".encode() for phase in ("starting agents", "waiting for agents")
    ]
    positions = [raw.find(text) for text in phases]
    assert -1 not in positions and positions == sorted(positions), raw[:2000]
    screen = pyte.Screen(COLUMNS, ROWS)
    pyte.ByteStream(screen).feed(raw.replace(b"\n", b"\r\n"))  # the pty's own onlcr, which pyte lacks
    lines = [line.rstrip() for line in screen.display if line.strip()]
    assert not any("hosts" in line and "/" in line for line in lines), lines  # no progress line is left
    # What is left: the ranks' lines, and distrun's end-of-run account after them.
    output = [line for line in lines if line.startswith("[")]
    assert sorted(output) == sorted(f"[{h}:{i}] {h}" for i, h in enumerate(cluster.hosts))


def test_no_progress_line_on_a_pipe(wide: Callable[[], Cluster]) -> None:
    cluster = wide()
    env = cluster.env(PYTHONPATH=str(REPO))
    result = run_distrun("-H", host_list(cluster), "--prefix", "none", "hostname", env=env)
    assert result.returncode == 0, result.stderr.decode()
    # Only the end-of-run account: no progress line, no cursor movement.
    assert b"\r" not in result.stderr and b"connecting" not in result.stderr
    assert result.stderr.startswith(b"distrun: host")
    assert sorted(result.stdout.decode().split()) == sorted(cluster.hosts)
