"""--gpus-per-rank, --bind-cores and --numa-binding on the command line, and what --dry-run shows of them."""

from __future__ import annotations

import sys

import pytest

from launcher.cli.main import Request, _parse
from tests.unit.cli_support import no_distrun_env, run  # noqa: F401  (the autouse fixture applies here)

GPU_HEADER = [
    "dry run: 4 processes on 2 hosts; nothing is started",
    f"command: {sys.executable} train.py",
    "GPUs, assuming each host shows enough, numbered from 0, and sets no CUDA_VISIBLE_DEVICES (at launch "
    "distrun hands out what each host shows, and refuses a host with too few):",
    "    host a: rank 0: GPUs 0,1; rank 1: GPUs 2,3",
    "    host b: rank 2: GPUs 0,1; rank 3: GPUs 2,3",
    "rank 0: host=a local_rank=0 node_rank=0",
]


def devices_of(out: str) -> list[str]:
    """Each rank's header with its device and thread lines: the part of the plan these options change."""
    wanted = ("rank ", "    CUDA_VISIBLE_DEVICES=", "    DISTRUN_OWN_GPUS=", "    OMP_NUM_THREADS=")
    return [line for line in out.splitlines() if line.startswith(wanted)]


def test_dry_run_shows_two_gpus_per_rank_on_two_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--dry-run", "-H", "a:2,b:2", "--gpus-per-rank", "2", "train.py")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:2] == GPU_HEADER[:2]
    # The forwarded environment's block comes between; the mapping leads into the ranks.
    start = lines.index(GPU_HEADER[2])
    assert lines[start : start + 4] == GPU_HEADER[2:]
    assert devices_of(out) == [
        "rank 0: host=a local_rank=0 node_rank=0",
        "    CUDA_VISIBLE_DEVICES=0,1",
        "    DISTRUN_OWN_GPUS=2",
        "    OMP_NUM_THREADS=1  # unless the host sets it",
        "rank 1: host=a local_rank=1 node_rank=0",
        "    CUDA_VISIBLE_DEVICES=2,3",
        "    DISTRUN_OWN_GPUS=2",
        "    OMP_NUM_THREADS=1  # unless the host sets it",
        "rank 2: host=b local_rank=0 node_rank=1",
        "    CUDA_VISIBLE_DEVICES=0,1",
        "    DISTRUN_OWN_GPUS=2",
        "    OMP_NUM_THREADS=1  # unless the host sets it",
        "rank 3: host=b local_rank=1 node_rank=1",
        "    CUDA_VISIBLE_DEVICES=2,3",
        "    DISTRUN_OWN_GPUS=2",
        "    OMP_NUM_THREADS=1  # unless the host sets it",
    ]


@pytest.mark.parametrize(
    ("options", "share"),
    [
        (["--bind-cores"], "an even share of its host's allowed cores"),
        (
            ["--gpus-per-rank", "1", "--numa-binding"],
            "a share of the allowed cores of its GPUs' NUMA node (of the host's, where the node is unknown)",
        ),
    ],
)
def test_dry_run_says_how_cores_will_be_bound(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, options: list[str], share: str
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code, out, err = run(capsys, "--dry-run", "-H", "a:2", *options, "train.py")
    assert (code, err) == (0, "")
    assert (
        f"cores: at launch each rank is pinned to {share}, disjoint from the other ranks', and "
        "OMP_NUM_THREADS is its core count unless set"
    ) in out.splitlines()
    assert out.splitlines().count("    OMP_NUM_THREADS=auto  # unless the host sets it") == 2


def test_without_the_options_the_plan_places_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--dry-run", "-H", "a:2", "train.py")[1]
    assert "CUDA_VISIBLE_DEVICES" not in out and "GPUs" not in out and "cores:" not in out


def request_for(*args: str) -> Request:
    request = _parse(args)
    assert isinstance(request, Request)
    return request


def test_options_reach_the_launch_config() -> None:
    config = request_for("--gpus-per-rank", "2", "--numa-binding", "-np", "1", "x").config
    assert (config.gpus_per_rank, config.bind_cores, config.numa_binding) == (2, False, True)
    assert config.placement.binds
    default = request_for("x").config
    assert (default.gpus_per_rank, default.bind_cores, default.numa_binding) == (None, False, False)
    assert not default.placement.active


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus-per-rank", "0"], "Invalid value for '--gpus-per-rank': 0 is not in the range x>=1."),
        (
            ["--numa-binding"],
            "--numa-binding binds ranks to their GPUs' NUMA nodes: give --gpus-per-rank too",
        ),
    ],
)
def test_bad_device_options_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--dry-run", *args, "train.py")
    assert (code, out) == (2, "")
    assert err == f"distrun: error: {message}\n"
