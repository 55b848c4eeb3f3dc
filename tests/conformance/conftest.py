"""The `backend` fixture: each conformance scenario runs once per backend, marked with what it needs."""

from __future__ import annotations

import pytest

from tests.conformance.backends import BACKENDS, Backend, Local, Slurm, Ssh


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test; a cluster one takes the session's cluster, which scenarios leave as found
    (a cut link is put back, every host emptied)."""
    if request.param == "ssh":
        return Ssh(request.getfixturevalue("cluster"))
    if request.param == "slurm":
        return Slurm(request.getfixturevalue("slurm"))
    return Local()
