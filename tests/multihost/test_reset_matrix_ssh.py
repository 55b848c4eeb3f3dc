"""`distrun top`, `distrun stacks`, then Ctrl-C or `--timeout`, in each phase of an elastic reset, with a rank
on each of three SSH hosts of the simulated cluster (tests/reset_matrix.py): the tools answer from every host,
the ending stops every rank, and nothing is left on any host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.reset_matrix import ENDINGS, PHASES, reset_cell
from tests.support import REPO

pytestmark = pytest.mark.multihost


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("phase", PHASES)
def test_tools_in_each_phase_of_a_reset_on_ssh_hosts(
    phase: str, ending: str, cluster: Cluster, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    out = tmp_path / "out"
    out.mkdir()
    env = cluster.env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime))
    said, pids = reset_cell(phase, ending, "h1:1,h2:1,h3:1", env, out)
    assert len(pids) == 3, said
    left = cluster.wait_clean(timeout=30)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
