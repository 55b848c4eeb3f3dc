"""Fixtures for tests that run real local processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import alive, recorded_pids


@pytest.fixture
def pid_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "pids"
    directory.mkdir()
    yield directory
    # Never leave our own workers behind, even when a test fails half-way.
    for pid in alive(recorded_pids(directory)):
        os.kill(pid, signal.SIGKILL)
