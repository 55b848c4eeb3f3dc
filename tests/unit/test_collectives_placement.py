"""Backend and device choice per rank, from a faked view of the GPUs (collectives.placement)."""

from __future__ import annotations

import pytest

from collectives.errors import CollectivesError
from collectives.placement import BackendChoice, GpuView, choose_backend

CPU = GpuView(cuda=False, nccl=False, count=0)
ONE_GPU = GpuView(cuda=True, nccl=True, count=1)
FOUR_GPUS = GpuView(cuda=True, nccl=True, count=4)
GIVEN_ONE = GpuView(cuda=True, nccl=True, count=1, visible_devices="GPU-8f2c", own=True)
GIVEN_TWO = GpuView(cuda=True, nccl=True, count=2, visible_devices="2,3", own=True)
USER_SET_ONE = GpuView(cuda=True, nccl=True, count=1, visible_devices="1")


def choose(requested: str | None, view: GpuView, local_rank: int, local_size: int) -> BackendChoice:
    return choose_backend(requested, view, local_rank=local_rank, local_size=local_size, host="node7")


@pytest.mark.parametrize(
    ("view", "local_size", "expected"),
    [
        (CPU, 4, [("gloo", None)] * 4),
        (GpuView(cuda=True, nccl=False, count=4), 2, [("gloo", None)] * 2),
        (ONE_GPU, 1, [("nccl", 0)]),
        (FOUR_GPUS, 4, [("nccl", 0), ("nccl", 1), ("nccl", 2), ("nccl", 3)]),
        (FOUR_GPUS, 2, [("nccl", 0), ("nccl", 1)]),
        # The crash: two ranks on a one-GPU machine no longer both pick cuda:0 under nccl.
        (ONE_GPU, 2, [("gloo", None)] * 2),
        (FOUR_GPUS, 8, [("gloo", None)] * 8),
        # A CUDA_VISIBLE_DEVICES that every rank inherits alike is shared, not per rank.
        (USER_SET_ONE, 2, [("gloo", None)] * 2),
        # distrun --gpus-per-rank: each rank's own devices, renumbered from 0.
        (GIVEN_ONE, 4, [("nccl", 0)] * 4),
        (GIVEN_TWO, 3, [("nccl", 0)] * 3),
    ],
)
def test_default_backend_and_device(
    view: GpuView, local_size: int, expected: list[tuple[str, int | None]]
) -> None:
    choices = [choose(None, view, rank, local_size) for rank in range(local_size)]
    assert [(c.backend, c.device_index) for c in choices] == expected


def test_too_few_gpus_warn_once_per_host_with_names_and_the_way_to_nccl() -> None:
    choices = [choose(None, USER_SET_ONE, rank, 2) for rank in range(2)]
    assert choices[1].warning is None
    assert choices[0].warning == (
        "collectives: host node7 runs 2 ranks but this rank sees 1 GPU (CUDA_VISIBLE_DEVICES='1'), so NCCL "
        "cannot give each rank its own GPU: using gloo on the CPU. For nccl, start at most 1 rank per host, "
        "or give each rank its own GPU (distrun --gpus-per-rank 1)"
    )
    assert choose(None, CPU, 0, 2).warning is None  # a CPU machine is not worth a word
    assert choose(None, FOUR_GPUS, 0, 4).warning is None


@pytest.mark.parametrize("requested", ["gloo", "mpi"])
def test_explicit_cpu_backends_are_kept_without_a_device(requested: str) -> None:
    assert choose(requested, FOUR_GPUS, 1, 4) == BackendChoice(requested, None)


@pytest.mark.parametrize(
    ("view", "local_rank", "local_size", "message"),
    [
        (
            ONE_GPU,
            1,
            2,
            r"host node7: it runs 2 ranks but this rank \(local rank 1\) sees 1 GPU, .*at most 1",
        ),
        (FOUR_GPUS, 0, 8, "runs 8 ranks but this rank .* sees 4 GPUs"),
        (CPU, 0, 1, "host node7: it sees no CUDA device"),
        (GpuView(cuda=True, nccl=True, count=0, visible_devices=""), 0, 1, "CUDA_VISIBLE_DEVICES=''"),
        (GpuView(cuda=True, nccl=False, count=2), 0, 1, "this torch build has no NCCL"),
    ],
)
def test_explicit_nccl_that_cannot_work_fails_with_one_line(
    view: GpuView, local_rank: int, local_size: int, message: str
) -> None:
    with pytest.raises(CollectivesError, match=message) as caught:
        choose("nccl", view, local_rank, local_size)
    assert "\n" not in str(caught.value)


def test_explicit_nccl_where_it_works() -> None:
    assert choose("nccl", FOUR_GPUS, 3, 4) == BackendChoice("nccl", 3)
    assert choose("nccl", GIVEN_TWO, 2, 3) == BackendChoice("nccl", 0)
    # Asked for explicitly, one device in CUDA_VISIBLE_DEVICES is trusted to be the rank's own.
    assert choose("nccl", USER_SET_ONE, 1, 2) == BackendChoice("nccl", 0)
    assert choose("cpu:gloo,cuda:nccl", FOUR_GPUS, 1, 2) == BackendChoice("cpu:gloo,cuda:nccl", 1)


def test_view_from_env() -> None:
    view = GpuView.from_env(
        {"DISTRUN_OWN_GPUS": "2", "CUDA_VISIBLE_DEVICES": "4,5"}, cuda=True, nccl=True, count=2
    )
    assert view == GpuView(cuda=True, nccl=True, count=2, visible_devices="4,5", own=True)
    assert not GpuView.from_env({}, cuda=True, nccl=True, count=1).own
    assert GpuView.from_env({}, cuda=False, nccl=False, count=3).count == 0
