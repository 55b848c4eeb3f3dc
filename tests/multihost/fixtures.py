"""Fixtures for tests that need the simulated SSH cluster (see tests/multihost/cluster.py).

A plugin that tests/conftest.py loads, not a conftest.py of this folder: a scenario that runs both on this
machine and on SSH hosts (the `where` fixture) lives with its local tests, and takes the one session cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.multihost.cluster import Cluster, cleanup_stale, impossible_reason, missing_tool_reason
from tests.multihost.support import WHERE, Where
from tests.support import require_machine


def _require_cluster_support() -> None:
    require_machine(impossible_reason(), missing_tool_reason())


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Three hosts h1..h3 shared by the whole session: tests must leave them as they found them."""
    _require_cluster_support()
    cleanup_stale()  # leftovers of an earlier run that was killed before its teardown
    with Cluster(3) as built:
        yield built


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    """Build private clusters for tests that break hosts (stop sshd, rotate keys); closed after the test."""
    _require_cluster_support()
    built: list[Cluster] = []

    def make(num_hosts: int = 2, **kwargs: Any) -> Cluster:
        new = Cluster(num_hosts, **kwargs)
        built.append(new)
        return new

    yield make
    for each in built:
        each.close()


@pytest.fixture(params=WHERE)
def where(request: pytest.FixtureRequest) -> Where:
    """Where the test's ranks run: "local" (this machine, -np) or "ssh" (hosts of the session `cluster`, -H;
    marked multihost, and skipped or failed as every cluster test is where this machine cannot build one)."""
    if request.param == "ssh":
        return Where(request.getfixturevalue("cluster"))
    return Where(None)
