"""--bind-cores and --gpus-per-rank with real local processes: what each rank is given, and refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from launcher.core.devices import format_cpulist
from launcher.core.plan import plural
from tests.support import SCRIPTS, clean_env, run_distrun

ALLOWED = sorted(os.sched_getaffinity(0))


def records(directory: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(ranks)]


def test_bind_cores_pins_each_rank_to_a_disjoint_share_with_as_many_omp_threads(tmp_path: Path) -> None:
    env = clean_env()
    env.pop("OMP_NUM_THREADS", None)
    ranks = min(2, len(ALLOWED))
    result = run_distrun("--bind-cores", "-v", "-np", ranks, SCRIPTS / "placement.py", tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    placed = records(tmp_path, ranks)
    cores = [set(r["cores"]) for r in placed]
    assert all(cores), placed
    assert sum(len(c) for c in cores) == len(set().union(*cores)), f"ranks share cores: {placed}"
    assert set().union(*cores) <= set(ALLOWED)
    assert [r["omp"] for r in placed] == [str(len(c)) for c in cores]
    mapping = [
        line for line in result.stderr.decode().splitlines() if line.startswith("distrun: host localhost: ")
    ]
    assert len(mapping) == 1 and "rank 0: cores " in mapping[0] and f"rank {ranks - 1}: cores " in mapping[0]


def test_a_users_omp_num_threads_wins_over_the_core_count(tmp_path: Path) -> None:
    result = run_distrun(
        "--bind-cores", "-np", 1, SCRIPTS / "placement.py", tmp_path, env=clean_env(OMP_NUM_THREADS="3")
    )
    assert result.returncode == 0, result.stderr
    assert records(tmp_path, 1)[0]["omp"] == "3"


def test_more_ranks_than_allowed_cores_are_refused_before_anything_starts(tmp_path: Path) -> None:
    ranks = len(ALLOWED) + 1
    result = run_distrun("--bind-cores", "-np", ranks, SCRIPTS / "placement.py", tmp_path)
    assert result.returncode == 3
    assert result.stderr.decode() == (
        f"distrun: error: host localhost: ranks 0-{ranks - 1} need 1 core each ({ranks}), but only "
        f"{plural(len(ALLOWED), 'core is', 'cores are')} allowed there ({format_cpulist(ALLOWED)})\n"
    )
    assert list(tmp_path.glob("rank*.json")) == []


def test_gpus_per_rank_on_a_host_showing_no_gpus_is_refused_with_host_and_ranks(tmp_path: Path) -> None:
    # clean_env hides every GPU, so the host shows none whatever this machine has.
    result = run_distrun("--gpus-per-rank", "1", "-np", 2, SCRIPTS / "placement.py", tmp_path)
    assert result.returncode == 3
    assert result.stderr.decode() == (
        "distrun: error: host localhost: ranks 0-1 need 1 GPU each (2), but it shows 0 GPUs (none) with "
        "CUDA_VISIBLE_DEVICES=''\n"
    )
    assert list(tmp_path.glob("rank*.json")) == []
