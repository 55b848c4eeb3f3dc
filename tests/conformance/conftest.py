"""The `backend` fixture: each conformance scenario runs once per backend, marked with what it needs."""

from __future__ import annotations

import pytest

from tests.conformance.backends import Backend, Local, Slurm, Ssh

# Each parameter carries the marker of what it needs, so that `-m "not multihost and not slurm"` (no root)
# still runs the local one.
BACKENDS = [
    pytest.param("local", id="local", marks=pytest.mark.integration),
    pytest.param("ssh", id="ssh", marks=pytest.mark.multihost),
    pytest.param("slurm", id="slurm", marks=pytest.mark.slurm),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test; a cluster one takes the session's cluster, which scenarios leave as found
    (a cut link is put back, every host emptied)."""
    if request.param == "ssh":
        return Ssh(request.getfixturevalue("cluster"))
    if request.param == "slurm":
        return Slurm(request.getfixturevalue("slurm"))
    return Local()
