"""``shutdown()`` then ``init()`` again, many times, on 2 and 3 real ranks under distrun: the pattern of
Horovod's gloo-mode tests (``HOROVOD_RANK`` set, so every test's tearDown shuts down and the next test
initialises). A rank other than 0 used to re-initialise while rank 0 still served the old store, join it,
and hang with rank 0 in the next group's creation (``collectives.leaving``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import clean_env

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "integration" / "workers" / "reinit_worker.py"
ROUNDS = 15


@pytest.mark.parametrize("size", [2, 3])
def test_shutdown_then_init_again_on_every_rank(size: int, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "-np", str(size), sys.executable, str(WORKER), str(ROUNDS)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "REINIT_GUARD_S": "90"},
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    found = [
        json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line
    ]
    assert done.returncode == 0 and len(found) == size, done.stdout[-3000:] + done.stderr[-3000:]
    expected = [float(sum(r + round_ for r in range(size))) for round_ in range(ROUNDS)]
    assert all(r["sums"] == expected for r in found)
    # The pattern's own cost: each round is an init, three collectives and a leave, no timeout.
    assert "leaves without every rank" not in done.stdout + done.stderr


def test_a_group_formed_again_prefixes_an_uncaught_exception_once(tmp_path: Path) -> None:
    """Each formation of torch's default group wraps the excepthook in one adding "[rank<N>]: "; the third
    group of a process prints that prefix once, not three times."""
    code = (
        "import collectives as hvd\n"
        "for _ in range(3):\n"
        "    hvd.init()\n"
        "    hvd.allreduce(__import__('torch').ones(1))\n"
        "    hvd.shutdown()\n"
        "hvd.init()\n"
        "raise RuntimeError('raised in the fourth group')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line]
    assert "[rank0]: RuntimeError: raised in the fourth group" in lines, done.stderr
    assert all(line.startswith("[rank0]: ") and "[rank0]: [rank0]" not in line for line in lines), lines
