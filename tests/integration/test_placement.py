"""--bind-cores and --gpus-per-rank with real local processes: what each rank is given, and refusals.

The tests taking `where` run on SSH hosts of the simulated cluster too: there the shipped agent reports the
cores and GPUs, and pins the ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from launcher.core.devices import format_cpulist
from launcher.core.plan import plural
from tests.multihost.support import Where
from tests.support import SCRIPTS, clean_env, run_distrun

ALLOWED = sorted(os.sched_getaffinity(0))


def records(directory: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(ranks)]


def test_bind_cores_pins_each_rank_to_a_disjoint_share_with_as_many_omp_threads(
    tmp_path: Path, where: Where
) -> None:
    if where.cluster is not None:
        # Two ranks on h1, one on h2: the shipped agent reports each host's cores and pins its ranks.
        hosts: tuple[str | int, ...] = ("-H", "h1:2,h2:1")
        ranks, env = 3, where.env()
    else:
        ranks = min(2, len(ALLOWED))
        hosts, env = ("-np", ranks), clean_env()
        env.pop("OMP_NUM_THREADS", None)
    result = run_distrun("--bind-cores", "-v", *hosts, SCRIPTS / "placement.py", tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    placed = records(tmp_path, ranks)
    if where.ssh:
        h1 = [set(p["cores"]) for p in placed[:2]]
        assert all(h1) and not h1[0] & h1[1], placed
        assert [p["omp"] for p in placed] == [str(len(p["cores"])) for p in placed]
        stderr = result.stderr.decode()
        assert "distrun: host h1: rank 0: cores " in stderr and "distrun: host h2: rank 2: cores " in stderr
        where.assert_clean()
        return
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


def test_gpus_per_rank_on_a_host_showing_no_gpus_is_refused_with_host_and_ranks(
    tmp_path: Path, where: Where
) -> None:
    # clean_env hides every GPU, so the host shows none whatever this machine has; on SSH hosts -x hides them
    # on every host, so the hosts show none even where this machine has some.
    hosts = where.either(("-np", "2"), ("-H", "h1:2,h2:1", "-x", "CUDA_VISIBLE_DEVICES="))
    result = run_distrun(
        "--gpus-per-rank", "1", *hosts, SCRIPTS / "placement.py", tmp_path, env=where.env(), timeout=120
    )
    host = where.either("localhost", "h1")
    assert result.returncode == 3
    assert result.stderr.decode() == (
        f"distrun: error: host {host}: ranks 0-1 need 1 GPU each (2), but it shows 0 GPUs (none) with "
        "CUDA_VISIBLE_DEVICES=''\n"
    )
    assert list(tmp_path.glob("rank*.json")) == []
    where.assert_clean()
