"""What the agent reads for placing ranks, from a fake /proc and /sys tree
(launcher.agent.server.device_facts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.agent.facts import device_facts
from launcher.core.devices import Gpu, HostDevices, VisibleGpu

INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 52
GPU UUID: \t GPU-5c3a7e55-aaaa
Bus Location: \t 0000:3b:00.0
Device Minor: \t 1
"""


def write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_gpus_in_pci_order_with_uuids_and_numa_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    write(tmp_path, "proc/driver/nvidia/gpus/0000:3B:00.0/information", INFORMATION)
    write(tmp_path, "sys/bus/pci/devices/0000:3b:00.0/numa_node", "1\n")
    # The second GPU has no driver information and sysfs knows no node for it (-1).
    (tmp_path / "proc/driver/nvidia/gpus/0000:18:00.0").mkdir(parents=True)
    write(tmp_path, "sys/bus/pci/devices/0000:18:00.0/numa_node", "-1\n")
    write(tmp_path, "sys/devices/system/node/node0/cpulist", "0-3\n")
    write(tmp_path, "sys/devices/system/node/node1/cpulist", "4-7\n")
    write(tmp_path, "sys/devices/system/node/possible", "0-1\n")
    facts = device_facts(str(tmp_path))
    assert facts["gpus"] == [
        {"index": 0, "uuid": None, "numa_node": "-1"},
        {"index": 1, "uuid": "GPU-5c3a7e55-aaaa", "numa_node": "1"},
    ]
    assert facts["visible_devices"] == "1"
    assert facts["cores"] == sorted(os.sched_getaffinity(0))
    assert facts["numa_cpulists"] == {"0": "0-3", "1": "4-7"}
    # ... and the launcher reads it back as the host's GPUs, CUDA_VISIBLE_DEVICES applied.
    host = HostDevices.from_json(facts)
    assert host.gpus == (Gpu(0, None, None), Gpu(1, "GPU-5c3a7e55-aaaa", 1))
    assert host.visible() == (VisibleGpu("1", 1),)
    assert dict(host.numa_cores) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}


def test_without_the_driver_only_device_nodes_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        write(tmp_path, f"dev/{name}", "")
    facts = device_facts(str(tmp_path))
    assert facts["gpus"] == [{"index": 0}, {"index": 1}]
    assert (facts["visible_devices"], facts["numa_cpulists"]) == (None, {})
    assert [g.id for g in HostDevices.from_json(facts).visible()] == ["0", "1"]


def test_a_machine_without_gpus(tmp_path: Path) -> None:
    assert device_facts(str(tmp_path))["gpus"] == []
