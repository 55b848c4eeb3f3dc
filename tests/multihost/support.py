"""Shared by the tests on the simulated SSH cluster (tests/multihost/cluster.py).

"Clean" always means: listing the processes inside each host's namespace finds nothing but its sshd.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, clean_env, run_distrun

T = TypeVar("T")
# A wait that ends once every host is clean: on a loaded machine an agent whose SSH channel closed can take
# seconds to be told (sshd, then its stdin), though nothing of it runs any more.
CLEAN_WITHIN = 15.0
# A slow cable (Cluster.shape_link) for a launch's --preflight to find: 100 Mbit/s is 12.5 MB/s, over a
# hundred times below the bridge's ~2 GB/s (ten times is a certain outlier), and five times quicker to measure
# than the 20 Mbit/s of test_perf's check of the measured figure.
SLOW_CABLE = "100mbit"
# The params of the `where` fixture (tests/multihost/fixtures.py): a scenario on this machine, then on SSH
# hosts, which `-m "not multihost"` deselects. `pytest.mark.parametrize("where", [...], indirect=True)` picks
# other combinations.
WHERE = [pytest.param("local", id="local"), pytest.param("ssh", id="ssh", marks=pytest.mark.multihost)]


def distrun_on(
    cluster: Cluster, *args: str | os.PathLike[str], timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """`distrun ARGS` run to its end from the launch machine, with the cluster's ssh settings."""
    return run_distrun(*args, env=cluster.env(PYTHONPATH=str(REPO)), timeout=timeout)


def assert_clean(cluster: Cluster, within: float = CLEAN_WITHIN) -> None:
    """Every host runs nothing but its sshd within `within` seconds; what is left is named otherwise."""
    left = cluster.wait_clean(timeout=within)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}


@dataclass(frozen=True)
class Where:
    """Where a scenario's ranks run: on this machine (`cluster` None) or on SSH hosts of `cluster`."""

    cluster: Cluster | None

    @property
    def ssh(self) -> bool:
        return self.cluster is not None

    def either(self, local: T, ssh: T) -> T:
        """`local` on this machine, `ssh` on the cluster: the host options, the names the output shows."""
        return local if self.cluster is None else ssh

    def env(self, *, pythonpath: bool = True, **extra: str) -> dict[str, str]:
        """distrun's environment: `clean_env` here; the cluster's ssh settings there, with this repository on
        PYTHONPATH unless `pythonpath` is False."""
        if self.cluster is None:
            return clean_env(**extra)
        return self.cluster.env(**({"PYTHONPATH": str(REPO)} if pythonpath else {}), **extra)

    def env_with_own_runtime(self, tmp_path: Path) -> dict[str, str]:
        """`env` with a runtime directory of the test's own (`tmp_path/xdg`), where distrun keeps its jobs'
        control sockets: `distrun stacks` and `top` then find this test's job alone."""
        runtime = tmp_path / "xdg"
        runtime.mkdir(mode=0o700)
        return self.env(XDG_RUNTIME_DIR=str(runtime))

    def assert_clean(self, within: float = CLEAN_WITHIN) -> None:
        """On the cluster: every host is clean (`assert_clean`); here, nothing to check."""
        if self.cluster is not None:
            assert_clean(self.cluster, within)
