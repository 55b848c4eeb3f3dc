"""Per-process GPU utilisation and memory from NVML, read through ctypes: the agent stays stdlib-only.

NVML ships with the NVIDIA driver (libnvidia-ml.so.1), so a host with GPUs has it and needs no Python
package. A host without it (no driver, a CPU host, a container without the library) gets `open_nvml() ->
None`, and the samples' GPU fields stay null: never an error.

Attribution by pid first (each compute process's memory; each process's SM utilisation over the interval).
Inside a container with its own pid namespace NVML names the host's pids, which the agent cannot match:
then a process's GPUs are the /dev/nvidiaN it holds open, and it is given their whole utilisation and the
memory of every process on them.

Stdlib-only and Python 3.7 compatible: it is shipped to remote hosts with the agent.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, Tuple  # noqa: UP035 - Python 3.7 runs this

SUCCESS = 0
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
# usedGpuMemory when the driver may not say (no per-process accounting in this environment).
VALUE_NOT_AVAILABLE = (1 << 64) - 1
LIBRARY = "libnvidia-ml.so.1"

# (utilisation %, memory bytes) of one process on one device; None where NVML does not say.
Usage = Tuple[Optional[float], Optional[int]]  # noqa: UP006, UP045 - evaluated at run time, on Python 3.7 too


class _ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_v2_t, what the _v2 and _v3 calls fill.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _UtilizationSample(ctypes.Structure):
    # nvmlProcessUtilizationSample_t
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Nvml:
    """The host's GPUs as NVML sees them; `usage()` reads every device once per sample."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != SUCCESS:
            raise OSError("nvmlDeviceGetCount failed")
        self.devices: list[ctypes.c_void_p] = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == SUCCESS:
                self.devices.append(handle)
        # Per device: the newest utilisation sample already read (NVML returns those after it).
        self.last_seen = [0] * len(self.devices)
        self._processes = self._processes_call()

    def _processes_call(self) -> Any:
        for name, struct in (
            ("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessInfo),
            ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfo),
            ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1),
        ):
            function = getattr(self.lib, name, None)
            if function is not None:
                return function, struct
        return None

    def processes(self, device: int) -> dict[int, int | None]:
        """pid -> GPU memory in bytes (None: not available) of the compute processes on `device`."""
        if self._processes is None:
            return {}
        function, struct = self._processes
        size = 64
        while True:
            count = ctypes.c_uint(size)
            infos = (struct * size)()
            result = function(self.devices[device], ctypes.byref(count), infos)
            if result == ERROR_INSUFFICIENT_SIZE and size < 1 << 14:
                size = max(size * 2, count.value)
                continue
            if result != SUCCESS:
                return {}
            found: dict[int, int | None] = {}
            for info in infos[: count.value]:
                memory = info.usedGpuMemory
                found[info.pid] = None if memory == VALUE_NOT_AVAILABLE else int(memory)
            return found

    def process_utilization(self, device: int) -> dict[int, float]:
        """pid -> mean SM utilisation (%) over the samples since the last call; empty where unsupported."""
        handle = self.devices[device]
        count = ctypes.c_uint(0)
        since = ctypes.c_ulonglong(self.last_seen[device])
        function = self.lib.nvmlDeviceGetProcessUtilization
        result = function(handle, None, ctypes.byref(count), since)
        if result != ERROR_INSUFFICIENT_SIZE or not count.value:
            return {}
        samples = (_UtilizationSample * count.value)()
        if function(handle, samples, ctypes.byref(count), since) != SUCCESS:
            return {}
        sums: dict[int, list[float]] = {}
        for sample in samples[: count.value]:
            sums.setdefault(sample.pid, []).append(float(sample.smUtil))
            self.last_seen[device] = max(self.last_seen[device], sample.timeStamp)
        return {pid: sum(values) / len(values) for pid, values in sums.items()}

    def device_utilization(self, device: int) -> float | None:
        rates = _Utilization()
        if self.lib.nvmlDeviceGetUtilizationRates(self.devices[device], ctypes.byref(rates)) != SUCCESS:
            return None
        return float(rates.gpu)

    def usage(self, trees: dict[int, list[int]]) -> dict[int, Usage]:
        """Each tree's (utilisation %, memory bytes) over every device: `trees` maps a key (a rank) to the
        pids of its process tree. A tree on no GPU gets (None, None)."""
        per_device = []
        known_pids: set[int] = set()
        for device in range(len(self.devices)):
            memory = self.processes(device)
            utilization = self.process_utilization(device) if memory else {}
            per_device.append((memory, utilization))
            known_pids.update(memory)
        ours = {pid for pids in trees.values() for pid in pids}
        if known_pids and not known_pids & ours:
            return self._by_open_devices(trees, per_device)
        found: dict[int, Usage] = {}
        for key, pids in trees.items():
            util: float | None = None
            used: int | None = None
            for memory, utilization in per_device:
                on_it = [pid for pid in pids if pid in memory]
                if not on_it:
                    continue
                util = (util or 0.0) + sum(utilization.get(pid, 0.0) for pid in on_it)
                known = [memory[pid] for pid in on_it if memory[pid] is not None]
                if known:
                    used = (used or 0) + sum(m for m in known if m is not None)
            found[key] = (None if util is None else min(util, 100.0), used)
        return found

    def _by_open_devices(self, trees: dict[int, list[int]], per_device: list[Any]) -> dict[int, Usage]:
        """Another pid namespace: each tree gets the devices its processes hold open, whole."""
        found: dict[int, Usage] = {}
        for key, pids in trees.items():
            devices = set()
            for pid in pids:
                devices.update(open_devices(pid))
            devices = {d for d in devices if d < len(self.devices)}
            if not devices:
                found[key] = (None, None)
                continue
            utils = [u for u in (self.device_utilization(d) for d in sorted(devices)) if u is not None]
            memory = [m for d in devices for m in per_device[d][0].values() if m is not None]
            found[key] = (max(utils) if utils else None, sum(memory) if memory else None)
        return found


def open_devices(pid: int) -> list[int]:
    """The minor numbers of the /dev/nvidiaN a process holds open (N is NVML's index in PCI order)."""
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = []
    for name in names:
        try:
            target = os.readlink(os.path.join(base, name))
        except OSError:
            continue
        if target.startswith("/dev/nvidia") and target[11:].isdigit():
            found.append(int(target[11:]))
    return found


def open_nvml(library: str = LIBRARY) -> Nvml | None:
    """NVML initialised, or None where the host has no NVML (or it fails to start)."""
    try:
        lib = ctypes.CDLL(library)
        if lib.nvmlInit_v2() != SUCCESS:
            return None
        return Nvml(lib)
    except (OSError, AttributeError):
        return None
