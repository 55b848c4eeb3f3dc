"""Shared by the tests on the simulated SSH cluster (tests/multihost/cluster.py).

"Clean" always means: listing the processes inside each host's namespace finds nothing but its sshd.
"""

from __future__ import annotations

import os
import subprocess

from tests.multihost.cluster import Cluster
from tests.support import REPO, run_distrun

CLEAN_WITHIN = 5.0


def distrun_on(
    cluster: Cluster, *args: str | os.PathLike[str], timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """`distrun ARGS` run to its end from the launch machine, with the cluster's ssh settings."""
    return run_distrun(*args, env=cluster.env(PYTHONPATH=str(REPO)), timeout=timeout)


def assert_clean(cluster: Cluster, within: float = CLEAN_WITHIN) -> None:
    """Every host runs nothing but its sshd within `within` seconds; what is left is named otherwise."""
    left = cluster.wait_clean(timeout=within)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}
