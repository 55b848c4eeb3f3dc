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
from tests.collectives_checks import (  # noqa: E402, F401
    test_adopted_group_placement_from_host_names_and_env_consistency,
    test_allreduce_ops,
    test_averaged_gradients_equal_single_process_gradient_of_concatenated_batch,
    test_backward_passes_per_step_equals_one_step_on_four_times_the_data,
    test_broadcast_alltoall_reduce_scatter,
    test_broadcast_parameters_and_optimizer_state_make_replicas_identical,
    test_compressed_gradients_within_documented_tolerance,
    test_compression_with_accumulation_averages_once,
    test_failures_are_raised_on_every_rank_and_leave_ranks_in_step,
    test_grouped_allreduce_fuses_mixed_dtypes,
    test_in_place_and_async_variants,
    test_metrics_checkpoint_and_topology,
    test_parameters_without_gradients_neither_hang_nor_skew_the_average,
    test_ranks_using_different_parameters_get_identical_correct_gradients,
    test_sharding_covers_every_sample_exactly_once_per_epoch,
    test_sum_op_reduces_once_even_after_an_explicit_synchronize,
    test_training_matches_ddp_with_the_same_buckets,
    test_training_matches_single_process_on_combined_batches,
    test_uneven_allgather_concatenates_in_rank_order,
    test_wrapping_a_model_twice_reduces_with_the_new_optimizer_only,
    worker_job,
)


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, list[Any], Path]:
    size: int = request.param
    return worker_job(size, tmp_path_factory.mktemp(f"collectives{size}"))
