"""The multi-rank collectives checks, shared by the gloo jobs
(tests/integration/test_collectives_multirank.py) and the nccl job (tests/gpu/test_nccl.py).

Each `test_*` below judges one saved result of workers/collectives_worker.py against the single-process
reference or the closed-form expectation. This module is no test module: pytest collects the checks in the
test modules that import them, where they take that module's `job` fixture (its world size and backend).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, clean_env

torch = pytest.importorskip("torch")

WORKER = Path(__file__).resolve().parent / "integration" / "workers" / "collectives_worker.py"
JOB_TIMEOUT_S = 240


def run_distrun(
    ranks: int, script: Path, *args: str, env: dict[str, str] | None = None, timeout: float = JOB_TIMEOUT_S
) -> None:
    """Run ``script`` on ``ranks`` local ranks with distrun (gloo unless `env` shows GPUs); fail the test with
    its output on error."""
    command = [sys.executable, "-m", "launcher", "-np", str(ranks), str(script), *args]
    proc = subprocess.run(
        command, cwd=REPO, env=env or clean_env(), capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )


def worker_job(
    size: int,
    outdir: Path,
    env: dict[str, str] | None = None,
    timeout: float = JOB_TIMEOUT_S,
    worker: Path = WORKER,
) -> tuple[int, list[Any], Path]:
    """A worker (the collectives worker by default) on `size` ranks: what the `job` fixtures give their
    tests."""
    run_distrun(size, worker, str(outdir), env=env, timeout=timeout)
    results = [torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(size)]
    return size, results, outdir


def assert_all_close(actual: list[Any], expected: list[Any], atol: float = 1e-6, rtol: float = 1e-5) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)


def test_averaged_gradients_equal_single_process_gradient_of_concatenated_batch(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["gradients"]["dist"], res["gradients"]["ref"])


# Documented bound (docs/collectives.md): relative error in norm <= size * unit roundoff of the wire dtype.
@pytest.mark.parametrize(
    ("name", "unit_roundoff"), [("gradients_fp16", 2.0**-11), ("gradients_bf16", 2.0**-8)]
)
def test_compressed_gradients_within_documented_tolerance(job: Any, name: str, unit_roundoff: float) -> None:
    size, results, _ = job
    tolerance = size * unit_roundoff
    for res in results:
        for got, ref in zip(res[name]["dist"], res[name]["ref"], strict=True):
            relative = float((got - ref).norm() / ref.norm())
            assert relative <= tolerance, f"{name}: relative error {relative:.2e} > {tolerance:.1e}"
    # Compression must not be a no-op either: the wire really carried 16-bit values.
    assert any(
        not torch.equal(g, r)
        for res in results
        for g, r in zip(res[name]["dist"], res[name]["ref"], strict=True)
    )


def test_training_matches_single_process_on_combined_batches(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["training"]["dist"], res["training"]["ref"], atol=1e-5)
    assert_all_close(results[-1]["training"]["dist"], results[0]["training"]["dist"], atol=0, rtol=0)


def test_backward_passes_per_step_sums_the_passes_and_averages_over_ranks(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["accumulation"]["dist"], res["accumulation"]["ref"])
        assert res["accumulation"]["too_many_raised"]


def test_step_before_the_last_backward_pass_reduces_what_accumulated_and_restarts_the_count(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["accumulation_early_step"]["dist"], res["accumulation_early_step"]["ref"])


def test_sum_op_reduces_once_even_after_an_explicit_synchronize(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["sum_op"]["dist"], res["sum_op"]["ref"])


def test_compression_with_accumulation_averages_once(job: Any) -> None:
    size, results, _ = job
    for res in results:
        for got, ref in zip(
            res["compressed_accumulation"]["dist"], res["compressed_accumulation"]["ref"], strict=True
        ):
            relative = float((got - ref).norm() / ref.norm())
            assert relative <= size * 2.0**-11, f"relative error {relative:.2e}"


def test_ranks_using_different_parameters_get_identical_correct_gradients(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert all(g is not None for g in res["different_parameters"]["dist"])
        assert_all_close(res["different_parameters"]["dist"], res["different_parameters"]["ref"])
        assert_all_close(
            res["different_parameters"]["dist"], results[0]["different_parameters"]["dist"], 0, 0
        )


def test_training_matches_ddp_with_the_same_buckets(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["ddp"]["dist"], res["ddp"]["ddp"])
        # With fp16 on the wire, against DDP's fp16_compress_hook: the same rounding, so nearly the same.
        assert_all_close(res["ddp_fp16"]["dist"], res["ddp_fp16"]["ddp"], atol=1e-4, rtol=1e-3)
    exact, rounded = results[0]["ddp"]["dist"], results[0]["ddp_fp16"]["dist"]
    assert not all(torch.equal(a, b) for a, b in zip(exact, rounded, strict=True)), "fp16 must round"


def test_parameters_without_gradients_neither_hang_nor_skew_the_average(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert_all_close(res["unused"]["dist"], res["unused"]["ref"])
        # Unused on every rank: a zero gradient (Horovod's behaviour), not None.
        assert all(torch.equal(g, torch.zeros_like(g)) for g in res["unused"]["idle_grads"])


def test_wrapping_a_model_twice_reduces_with_the_new_optimizer_only(job: Any) -> None:
    _, results, _ = job
    for res in results:
        assert res["rewrap"]["old_alive"]
        assert_all_close(res["rewrap"]["dist"], res["rewrap"]["ref"], atol=1e-5)


def test_adopted_group_placement_from_host_names_and_env_consistency(job: Any) -> None:
    size, results, _ = job
    for rank, res in enumerate(results):
        assert res["env_mismatch_refused"]
        # Every rank of this job runs on this host: local rank = rank, one host.
        assert res["ops"]["topology"] == (rank, size, rank, size, 0, 1)


def test_broadcast_parameters_and_optimizer_state_make_replicas_identical(job: Any) -> None:
    _, results, _ = job
    root_before = results[0]["broadcast_state"]["before"]
    other_before = results[1]["broadcast_state"]["before"]
    assert not all(torch.equal(a, b) for a, b in zip(root_before, other_before, strict=True))
    for res in results:
        assert_all_close(res["broadcast_state"]["after"], root_before, atol=0, rtol=0)
        assert_all_close(res["broadcast_state"]["moments"], results[0]["broadcast_state"]["moments"], 0, 0)
        assert res["broadcast_state"]["lr"] == pytest.approx(1e-3)


def test_allreduce_ops(job: Any) -> None:
    size, results, _ = job
    values = torch.tensor([[r + 1.0, 2.0 * (r + 1)] for r in range(size)])
    expected = {
        "AVERAGE": values.mean(0),
        "SUM": values.sum(0),
        "MIN": values.min(0).values,
        "MAX": values.max(0).values,
        "PRODUCT": values.prod(0),
    }
    for res in results:
        ops = res["ops"]
        for name, value in expected.items():
            torch.testing.assert_close(ops[name], value)
        assert ops["input_unchanged"]
        torch.testing.assert_close(ops["async"], expected["SUM"])
        torch.testing.assert_close(ops["inplace"], expected["AVERAGE"])
        assert ops["int_average"].tolist() == [sum(3 * r + 1 for r in range(size)) // size] * 2


def test_grouped_allreduce_fuses_mixed_dtypes(job: Any) -> None:
    size, results, _ = job
    mean_rank = (size - 1) / 2
    rank_sum = size * (size - 1) // 2
    for res in results:
        floats, doubles = res["ops"]["grouped"]
        torch.testing.assert_close(floats, torch.full((3,), mean_rank))
        torch.testing.assert_close(doubles, torch.full((2, 2), mean_rank, dtype=torch.float64))
        ints, sums = res["ops"]["grouped_sum_int"]
        assert ints.dtype == torch.int64
        assert torch.equal(ints, torch.full((4,), rank_sum, dtype=torch.int64))
        torch.testing.assert_close(sums, torch.full((2,), float(rank_sum)))


def test_in_place_and_async_variants(job: Any) -> None:
    size, results, _ = job
    rank_sum = size * (size - 1) // 2
    for res in results:
        ops = res["async_inplace"]
        value, same_object, completed, wait_again_same = ops["allreduce_async_"]
        torch.testing.assert_close(value, torch.full((3,), (size - 1) / 2))
        assert same_object and completed and wait_again_same
        floats, ints, returned_inputs = ops["grouped_allreduce_"]
        torch.testing.assert_close(floats, torch.full((2,), float(rank_sum)))
        assert torch.equal(ints, torch.full((4,), rank_sum, dtype=torch.int64))
        assert returned_inputs
        (first, second), returned_inputs, completed = ops["grouped_allreduce_async_"]
        torch.testing.assert_close(first, torch.full((2,), float(size)))
        torch.testing.assert_close(second, torch.full((2, 2), 2.0 * (size - 1), dtype=torch.float64))
        assert returned_inputs and completed
        returned_input, broadcast = ops["broadcast_"]
        assert returned_input and torch.equal(broadcast, torch.full((2,), float(size - 1)))


def test_failures_are_raised_on_every_rank_and_leave_ranks_in_step(job: Any) -> None:
    size, results, outdir = job
    for rank, res in enumerate(results):
        errors = res["errors_in_step"]
        assert errors["allgather_dtype_raised"]
        message, cause = errors["ckpt_failure"]
        assert "failed on rank 0" in message and "pickle" in message
        # The root chains the original exception; the others only have its description.
        assert cause == ("AttributeError" if rank == 0 else None)
        assert torch.equal(errors["in_step_after_failures"], torch.tensor([float(size * (size - 1) // 2)]))
        # 0o666 less the umask 022 the worker set, as a plain open() would give; mkstemp alone gives 0600.
        assert errors["ckpt_mode"] == (0o644 if rank == 0 else None)
    assert not (outdir / "ckpt" / "bad.pt").exists()


def test_uneven_allgather_concatenates_in_rank_order(job: Any) -> None:
    size, results, _ = job
    expected = torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)])
    for res in results:
        assert torch.equal(res["ops"]["allgather_uneven"], expected)
        assert torch.equal(
            res["ops"]["allgather_even"], torch.cat([torch.full((2,), float(r)) for r in range(size)])
        )


def test_broadcast_alltoall_reduce_scatter(job: Any) -> None:
    size, results, _ = job
    for rank, res in enumerate(results):
        ops = res["ops"]
        assert torch.equal(ops["broadcast"], torch.full((3,), float(size - 1)))
        assert ops["broadcast_object"] == {"from": size - 1}
        received = torch.cat([torch.full((rank + 1, 2), 100.0 * j + rank) for j in range(size)])
        assert torch.equal(ops["alltoall"], received)
        assert ops["alltoall_received"].tolist() == [rank + 1] * size
        even = torch.tensor([10.0 * j + 2 * rank + k for j in range(size) for k in range(2)])
        assert torch.equal(ops["alltoall_even"], even)
        factor = sum(r + 1 for r in range(size)) / size
        full = torch.arange(size * 2.0 * 2).view(size * 2, 2) * factor
        torch.testing.assert_close(ops["reduce_scatter_even"], full[2 * rank : 2 * rank + 2])
        rows = size * 2 + 1
        start = rank * 2 + min(rank, 1)
        count = 3 if rank == 0 else 2
        summed = torch.arange(float(rows)) * sum(r + 1 for r in range(size))
        torch.testing.assert_close(ops["reduce_scatter_uneven"], summed[start : start + count])


def test_metrics_checkpoint_and_topology(job: Any) -> None:
    size, results, outdir = job
    for rank, res in enumerate(results):
        ops = res["ops"]
        assert ops["metrics"] == pytest.approx({"loss": (size - 1) / 2, "acc": float(size - 1)})
        assert ops["metric_mismatch_raised"]
        assert ops["ckpt_written"] == (str(outdir / "ckpt" / "model.pt") if rank == 0 else None)
        assert torch.equal(ops["ckpt_loaded"]["w"], torch.arange(3.0))
        assert ops["ckpt_loaded"]["epoch"] == 3
        assert ops["ckpt_missing"] is None
        assert ops["topology"] == (rank, size, rank, size, 0, 1)
        assert ops["is_coordinator"] == (rank == 0)
        assert res["zero_grad_guard"]
    # No temporary files left behind, and nothing where the failed save pointed.
    assert sorted(p.name for p in (outdir / "ckpt").iterdir()) == ["mode.pt", "model.pt"]


def test_sharding_covers_every_sample_exactly_once_per_epoch(job: Any) -> None:
    size, results, _ = job
    for epoch in range(2):
        shards = [res["sharding"]["epochs"][epoch] for res in results]
        every = sorted(i for s in shards for i in s["indices"])
        assert every == list(range(103))
        assert all(s["len"] == len(s["indices"]) for s in shards)
        batches = [s["batches"] for s in shards]
        assert len({len(b) for b in batches}) == 1, "every rank must take the same number of steps"
        assert all(batch for b in batches for batch in b)
        for s in shards:
            assert [i for batch in s["batches"] for i in batch] == s["indices"]
    first, second = (results[0]["sharding"]["epochs"][e]["indices"] for e in range(2))
    assert first != second, "a new epoch must reshuffle"
    assert first != list(range(0, 103, size)), "shuffle-then-shard, not shard-without-shuffle"


# What `from tests.collectives_checks import *` brings into a test module: every check, for pytest to collect.
__all__ = [name for name in dict(globals()) if name.startswith("test_")]
