"""The engine with real ranks: async operations submitted in different orders, Horovod's duplicate-name case,
a mismatch, fusion (seen through the engine's counter), the stall report, blocking collectives between
``backward()`` and ``step()`` with a bucket still unlaunched, and a peer killed mid-operation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, start_two_ranks

WORKER = REPO / "tests" / "integration" / "workers" / "engine_worker.py"


def _results(output: str) -> dict[int, dict[str, Any]]:
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in output.splitlines() if "RESULT " in line]
    return {r["rank"]: r for r in found}


def _prod(values: list[float]) -> float:
    out = 1.0
    for v in values:
        out *= v
    return out


@pytest.mark.parametrize("size", [2, 3])
def test_engine_scenarios(size: int, tmp_path: Path) -> None:
    env = {**os.environ, "HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "-np", str(size), sys.executable, str(WORKER), "scenarios"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = _results(done.stdout)
    assert done.returncode == 0 and len(results) == size, done.stdout + done.stderr
    total = sum(range(size))
    for rank, r in results.items():
        # Rank r submits order.j as its (j if r is even else 5 - j)-th operation, with that index plus r.
        expected = {
            f"order.{j}": [float(sum((j if q % 2 == 0 else 5 - j) + q for q in range(size)))] * 4
            for j in range(6)
        }
        assert r["orders"] == expected
        assert r["duplicate"] == ("ArgumentError" if rank == 0 else "not submitted twice")
        assert r["dup_result"] == [1.0, 1.0, 1.0]
        assert r["mismatch"].startswith("Mismatched allreduce tensor shapes")
        ranks = [float(q + 1) for q in range(size)]
        assert r["in_round"] == {
            "Sum": [sum(ranks), -sum(ranks), 0.5 * sum(ranks)],
            "Average": [sum(ranks) / size, -sum(ranks) / size, 0.5 * sum(ranks) / size],
            "Min": [1.0, -float(size), 0.5],
            "Max": [float(size), -1.0, 0.5 * size],
            "Product": r["in_round"]["Product"],
            "int_average": [sum(q * 3 + 1 for q in range(size)) // size],
            "2-d": [[float(size)] * 3] * 2,
            "in_round": 7,
            "issued": 0,
            "large": [float(size)] * 2,
            "large_issued": 1,
            "grouped": [
                [True, True, [float(sum(ranks))], [float(sum(ranks))]],
                [True, True, [float(sum(ranks))], [float(sum(ranks))]],
                [True, True, [sum(ranks) / size], [sum(ranks) / size]],
            ],
            "grouped_issued": 1,
            "grouped_in_round": 2,
        }
        assert r["in_round"]["Product"] == [
            _prod(ranks),
            _prod([-q for q in ranks]),
            _prod([0.5 * q for q in ranks]),
        ]
        assert r["fused_collectives"] < 32
        assert r["fused_values"] == [float(total)]
        values = [q * 3 + 1 for q in range(size)]
        assert r["fused_ops"] == {
            "Min": [1],
            "Max": [values[-1]],
            "Average": [sum(values) // size],
            "Product": [_prod(values)],
        }
        mean = sum(range(size)) / size
        assert r["ride_values"] == [[[i + mean] for i in range(12)]] * 10
        assert r["rode"]
        assert r["held_engine_rounds"] == []
        assert r["held_missed"] == r["held_told"] == [True] * 3
        assert r["held_values"] == [[float(i * size + total) for i in range(16)]] * 3
        assert r["lonely"] == [1.0]
        assert r["between"] == {"loss_sum": True, "object": {"step": 1}, "grad_bias": [2.0] * 4}
    assert "rank 1 missing ['lonely']" in results[0]["stall"]
    assert results[0]["stall_thread"]


@pytest.mark.parametrize("during", ["op", "barrier", "step", "cached_step", "issued"])
def test_a_killed_peer_fails_the_survivors_pending_operations(during: str, tmp_path: Path) -> None:
    procs = start_two_ranks(WORKER, "kill", during)
    try:
        # A limit for a hang only: two torch imports took over 120 s with the machine at a load of 50.
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    survivor = _results(outputs[0])[0]
    assert survivor["outcome"] == "HorovodInternalError", survivor
    assert survivor["later"] == "HorovodInternalError"
    # Seen through the engine's rounds or the transport at once, not at a timeout (gloo's is 30 min).
    assert survivor["seconds"] < 60, survivor
