"""Multi-rank correctness of collectives, through distrun with real gloo processes.

One job per world size (2 and 3) runs every scenario in workers/collectives_worker.py; each check (in
tests/collectives_checks.py, shared with the nccl tests) judges one saved result against the single-process
reference or the closed-form expectation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

# Collected here by pytest, where they use this module's gloo `job` fixture.
from tests.collectives_checks import *  # noqa: E402, F403
from tests.collectives_checks import worker_job  # noqa: E402


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, list[Any], Path]:
    size: int = request.param
    return worker_job(size, tmp_path_factory.mktemp(f"collectives{size}"))
