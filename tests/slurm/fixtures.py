"""Fixtures for tests that need a real Slurm cluster (see tests/slurm/cluster.py).

A plugin that tests/conftest.py loads, as tests/multihost/fixtures.py is: the conformance scenarios
(tests/conformance) take the one session cluster too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.multihost.cluster import cleanup_stale, impossible_reason
from tests.slurm.cluster import SlurmCluster, slurm_missing_tool_reason
from tests.support import require_machine


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """Three nodes node01..node03 shared by the whole session: tests must leave them idle and clean."""
    require_machine(impossible_reason(), slurm_missing_tool_reason())
    cleanup_stale()  # leftovers of an earlier run that was killed before its teardown
    with SlurmCluster(3) as built:
        yield built
