"""What every test may take for granted, whatever machine, job or shell the suite runs in.

The suite must pass inside another launcher's rank (torchrun, mpirun and srun leave TORCHELASTIC_*, OMPI_*,
PMIX_*, SLURM_* behind), inside a distrun job, and when started with Ctrl-C or the hang-up ignored (`nohup
pytest`, a script's `pytest &`). Both fixtures hold for the whole session, so session fixtures (the
simulated clusters) start under the same conditions as the tests.
"""

from __future__ import annotations

import compileall
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests import alone
from tests.markers import markers_for
from tests.support import REPO, SENT_BY_TESTS, is_outer_job

# The simulated clusters' fixtures, for tests/multihost and tests/slurm, for the scenarios that run both here
# and there, and for the conformance scenarios that run on every backend (tests/conformance); and
# `--cpu-durations`.
pytest_plugins = ("tests.multihost.fixtures", "tests.slurm.fixtures", "tests.cpu_time")


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode for everything the processes the tests start import, once per run (by the controller of an
    xdist run), as an installed distrun has it. Where PYTHONDONTWRITEBYTECODE is set (some sandboxes and CI
    images set it), every distrun, agent and rank would otherwise compile the sources again: 0.2-0.3 s of
    CPU for each distrun, in a suite that starts thousands of them on two cores."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller compiled already
        return
    for folder in ("launcher", "collectives", "tests", "examples", "benchmarks"):
        compileall.compile_dir(REPO / folder, quiet=2)  # a read-only checkout just goes without


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers by folder and by fixture, so that `-m "not multihost and not slurm"` (no root needed) and
    `-m unit` select by what a test needs, with no marker to remember in each new file."""
    for item in items:
        have = {mark.name for mark in item.iter_markers()}
        for name in sorted(markers_for(item.path, getattr(item, "fixturenames", ())) - have):
            item.add_marker(name)
    # The tests that run alone go last, together: in an xdist run each one stops every other worker at the
    # gate until their tests end, so that spread among the others the workers would idle once per such test.
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)


@pytest.fixture
def collector_as_it_was() -> Iterator[None]:
    """For a test that enables, disables or freezes this process's garbage collector: enabled or not as
    before once it ends, and nothing left frozen."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


@pytest.fixture(autouse=True)
def machine(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `alone` (it measures the machine) runs with no other worker's test beside it."""
    with alone.running(request.node.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(autouse=True, scope="session")
def no_outer_job() -> Iterator[None]:
    """The environment less every variable of an enclosing job: the tests see, and the distrun they start
    forwards, only what they set themselves."""
    with pytest.MonkeyPatch.context() as patch:
        for name in sorted(filter(is_outer_job, os.environ)):
            patch.delenv(name)
        yield


def _not_ignored(signum: int, frame: object) -> None:
    """Does what SIG_IGN did for this process, yet is reset to the default in every program it starts."""


@pytest.fixture(autouse=True, scope="session")
def children_get_default_signals() -> Iterator[None]:
    """An ignored signal stays ignored across exec, and distrun rightly keeps it so (`nohup distrun`): a
    suite started with SIGINT/SIGHUP/SIGQUIT ignored would start every distrun deaf to what the tests send.

    A handler, unlike SIG_IGN, is reset to the default at exec, so every process a test starts (whatever it
    starts it with: Popen, pty.fork, a helper) begins with default dispositions, while the suite itself still
    lets those signals pass as its shell asked."""
    ignored = [sig for sig in SENT_BY_TESTS if signal.getsignal(sig) == signal.SIG_IGN]
    for sig in ignored:
        signal.signal(sig, _not_ignored)
    try:
        yield
    finally:
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-load", type=int, default=0, metavar="N",
        help="run the tests with N CPU-burning processes beside them (.ci/run runs the elastic tests so)",
    )  # fmt: skip


@pytest.fixture(autouse=True, scope="session")
def cpu_load(request: pytest.FixtureRequest) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`--cpu-load N`: N processes spinning a core each for the whole session, so that events arrive as they
    do on a busy machine (seconds apart, in another order); stopped by pid at the end."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(request.config.getoption("--cpu-load"))
    ]
    try:
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
