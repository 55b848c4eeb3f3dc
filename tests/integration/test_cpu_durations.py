"""`--cpu-durations` (tests/cpu_time.py) in a pytest of its own: a test whose child process burns CPU is
counted with that child's CPU, a test that waits is not; under xdist too (the workers' counts reach the
controller that prints them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpu_time import _candidates
from tests.support import REPO

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
CASES = f"""
import subprocess, sys, time

def test_burns():
    # A child, not this process: what a test starts is what the count is for.
    subprocess.run([sys.executable, "-c", {BURN!r}], check=True)

def test_waits():
    time.sleep(1.5)
"""


def _writable_group() -> bool:
    return any(os.access(group, os.W_OK) for group, _ in _candidates())


@pytest.mark.skipif(not _writable_group(), reason="needs a cgroup it may write (root)")
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_the_test_whose_child_burns_cpu_is_counted_first(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    plugins = ["-p", "no:cacheprovider", "-p", "tests.cpu_time"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, "--cpu-durations", "2", *workers, "test_cases.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    counted = dict(
        (name, float(cpu))
        for cpu, name in re.findall(r"^ *([0-9.]+)s cpu  test_cases\.py::(\w+)$", done.stdout, re.M)
    )
    assert set(counted) == {"test_burns", "test_waits"}, done.stdout
    assert counted["test_burns"] >= 1.4, done.stdout
    assert counted["test_waits"] < 0.5, done.stdout
    assert "most CPU: 2 tests counted" in done.stdout
