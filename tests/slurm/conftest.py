"""Fixtures for tests that need a real Slurm cluster (see tests/slurm/cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.multihost.cluster import cleanup_stale
from tests.slurm.cluster import SlurmCluster, slurm_unavailable_reason


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """Three nodes node01..node03 shared by the whole session: tests must leave them idle and clean."""
    # Skip only when the machine cannot run Slurm at all; any failure past this point is a real failure.
    reason = slurm_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cleanup_stale()  # leftovers of an earlier run that was killed before its teardown
    with SlurmCluster(3) as built:
        yield built
