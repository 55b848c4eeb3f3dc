"""The agent's samples of real process trees: CPU, memory, stopped; GPU fields null without NVML."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.agent.nvml import open_nvml
from launcher.agent.protocol import RankSample, Samples
from launcher.agent.sampling import Sampler, tree
from tests.support import wait_until

# A parent that starts a child spinning a core and holds 64 MiB itself.
_TREE = """
import subprocess, sys, time
held = bytearray(64 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def parent() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        yield proc, child
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _sample(sampler: Sampler, pid: int) -> RankSample:
    """The next sample of rank 0 (pid), taken when due."""
    while True:
        now = time.monotonic()
        if sampler.due(now):
            samples = sampler.sample({0: pid}, now)
            if samples is not None:
                assert isinstance(samples, Samples)
                return samples.ranks[0]
        time.sleep(0.02)


def test_the_whole_tree_is_sampled_its_cpu_and_memory_summed(
    parent: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, child = parent
    assert tree(proc.pid) == [proc.pid, child]
    sampler = Sampler(0.5, time.monotonic())
    sampler.wrote(0, time.monotonic())
    sample = _sample(sampler, proc.pid)
    assert sample.processes == 2
    # The child spins; on a shared two-core machine with a dozen runnable processes it gets a few percent of
    # a core, and a tree whose CPU went unsummed would show ~0.
    assert sample.cpu_percent is not None and sample.cpu_percent > 1
    assert sample.rss_bytes is not None and sample.rss_bytes > 64 << 20
    assert sample.last_output_age_s is not None and 0 < sample.last_output_age_s < 5
    assert not sample.stopped


def test_a_stopped_rank_says_so_and_uses_no_cpu(parent: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, _ = parent
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        stat = Path(f"/proc/{proc.pid}/stat")
        wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", what="the rank stopped")
        sampler = Sampler(0.5, time.monotonic())
        sample = _sample(sampler, proc.pid)
        assert sample.stopped
        assert sample.cpu_percent is not None and sample.cpu_percent < 5
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


def test_without_nvml_the_gpu_fields_are_null_not_errors(parent: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, _ = parent
    assert open_nvml("libnvidia-ml-that-is-not-here.so.1") is None
    sampler = Sampler(0.5, time.monotonic(), nvml=None)
    sampler._nvml_tried = True  # as on a host where open_nvml() found no library
    sample = _sample(sampler, proc.pid)
    assert sample.gpu_util_percent is None and sample.gpu_memory_bytes is None
    assert sample.cpu_percent is not None


def test_this_machine_without_nvml_samples_null_gpu_fields(
    parent: tuple[subprocess.Popen[bytes], int],
) -> None:
    if open_nvml() is not None:
        pytest.skip("this machine has NVML (tests/gpu checks it)")
    proc, _ = parent
    sample = _sample(Sampler(0.5, time.monotonic()), proc.pid)
    assert (sample.gpu_util_percent, sample.gpu_memory_bytes) == (None, None)


def test_no_interval_never_samples() -> None:
    sampler = Sampler(0.0, time.monotonic())
    assert sampler.next_at is None and not sampler.due(time.monotonic() + 1e6)


def test_a_rank_gone_meanwhile_is_sampled_as_empty() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    gone = int(done.stdout)
    sampler = Sampler(0.1, time.monotonic())
    sample = _sample(sampler, gone)
    assert sample.rss_bytes == 0 and sample.cpu_percent == 0.0
