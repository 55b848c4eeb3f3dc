"""Job.place: from what the agents reported to each rank's devices, warnings and refusals (fake nodes)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from launcher.agent.protocol import Facts
from launcher.core.config import LaunchConfig
from launcher.core.devices import DeviceError, RankDevices
from launcher.core.hosts import Host
from launcher.core.plan import make_plan
from launcher.job.run import Job, job_loop
from tests.fakes import fake_hosts, memory_relay

GPUS = [{"index": i, "uuid": f"GPU-{i}", "numa_node": "0"} for i in range(2)]


def placed(
    devices: dict[str, Any], command: tuple[str, ...] = ("train.py",), **options: Any
) -> tuple[RankDevices, ...] | None:
    hosts = (Host("a", 2),)
    # Not this test process's environment: a CUDA_VISIBLE_DEVICES there would travel to the ranks.
    options.setdefault("forward_env", False)
    config = LaunchConfig(command=command, hosts=hosts, num_proc=2, **options)
    attempt = fake_hosts({"a": 2})
    attempt[0].facts = Facts("a", "python3", True, len(devices.get("gpus", [])), [], devices=devices)
    relay = memory_relay({0: "a", 1: "a"})[0]
    return Job(config, relay, job_loop(config, -1), [h.node for h in attempt]).place(
        make_plan(hosts, 2), attempt
    )


def test_gpus_and_cores_from_the_reported_facts() -> None:
    devices = {"gpus": GPUS, "visible_devices": None, "cores": [0, 1, 2, 3], "numa_cpulists": {"0": "0-3"}}
    assert placed(devices, gpus_per_rank=1, numa_binding=True) == (
        RankDevices(0, ("0",), (0, 1)),
        RankDevices(1, ("1",), (2, 3)),
    )


def test_an_exported_cuda_visible_devices_chooses_the_gpus_handed_out() -> None:
    devices = {"gpus": GPUS, "cores": [0]}
    with pytest.raises(
        DeviceError, match=r"^host a: ranks 0-1 need 1 GPU each \(2\), but it shows 1 GPU \(1\)"
    ):
        placed(devices, gpus_per_rank=1, exports=(("CUDA_VISIBLE_DEVICES", "1"),))


def test_a_cuda_visible_devices_from_an_env_file_or_this_shell_chooses_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices = {"gpus": GPUS, "cores": [0]}
    message = r"^host a: ranks 0-1 need 1 GPU each \(2\), but it shows 1 GPU \(1\)"
    with pytest.raises(DeviceError, match=message):
        placed(devices, gpus_per_rank=1, env_file=(("CUDA_VISIBLE_DEVICES", "1"),))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(DeviceError, match=message):
        placed(devices, gpus_per_rank=1, forward_env=True)


def test_nothing_asked_nothing_placed() -> None:
    assert placed({"gpus": GPUS, "cores": [0, 1]}) is None


def test_a_gpu_job_with_more_ranks_than_gpus_gets_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="launcher.job.run"):
        placed({"gpus": GPUS[:1], "cores": [0, 1]})
        placed({"gpus": GPUS[:1], "cores": [0, 1]}, command=("hostname",))
        placed({"gpus": GPUS, "cores": [0, 1]})
    assert [r.getMessage() for r in caplog.records] == [
        "host a: 2 ranks share 1 GPU, so they cannot each have their own (collectives falls back to gloo "
        "there); for a GPU job start at most 1 there, or use --gpus-per-rank on hosts with enough"
    ]
