"""Tests that measure the machine run alone, whatever the number of pytest-xdist workers.

`check --perf` and `--preflight` name a host whose link or CPU measures far below the others'; with other
workers' tests beside them on a two-core machine, a healthy host can measure half the median. A test marked
`alone` holds an exclusive lock while it runs; every other test holds it shared. A gate in front keeps the
exclusive one from waiting forever behind a stream of shared holders: it takes the gate first, so no new
test starts while it waits for the running ones to end. Serially (no workers) the locks are uncontended.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# One pair of lock files per run: xdist's workers share the controller's run id; a serial run has none.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"serial-{os.getpid()}")
_DIR = Path(tempfile.gettempdir())


@contextmanager
def _locked(name: str, mode: int) -> Iterator[None]:
    with open(_DIR / f"distrun-tests-{_RUN}.{name}", "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def running(alone: bool) -> Iterator[None]:
    """Hold the machine for one test: exclusively where `alone`, else shared with the other workers'."""
    if alone:
        with _locked("gate", fcntl.LOCK_EX), _locked("machine", fcntl.LOCK_EX):
            yield
        return
    with _locked("gate", fcntl.LOCK_EX):
        pass  # an exclusive test waiting holds the gate: wait behind it
    with _locked("machine", fcntl.LOCK_SH):
        yield
