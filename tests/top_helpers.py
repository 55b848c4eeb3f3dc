"""Shared by the tests of `distrun top` on this machine and on SSH hosts: its JSON rows, and telling
scripts/idle_spin_hold.py's ranks apart by them."""

from __future__ import annotations

import json
import subprocess
import time

from tests.support import distrun_argv, wait_until

MiB = 1 << 20


def top_json(pid: int | None, env: dict[str, str]) -> dict[int, dict[str, object]]:
    args = ["top", "--once", "--json", *(["--job", str(pid)] if pid else [])]
    done = subprocess.run(distrun_argv(*args), capture_output=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    return {int(row["rank"]): row for row in rows}


def told_apart(rows: dict[int, dict[str, object]]) -> bool:
    """Rank 0 idles, rank 1 spins, rank 2 holds 400 MiB (scripts/idle_spin_hold.py)."""
    cpu = {rank: row["cpu_percent"] for rank, row in rows.items()}
    rss = {rank: row["rss_bytes"] for rank, row in rows.items()}
    if any(not isinstance(v, int | float) for v in (*cpu.values(), *rss.values())):
        return False
    return (
        float(cpu[1]) > 30 and float(cpu[1]) > 5 * max(float(cpu[0]), float(cpu[2]), 1.0)  # type: ignore[arg-type]
        and int(rss[2]) >= 400 * MiB > 4 * max(int(rss[0]), int(rss[1]))  # type: ignore[call-overload]
    )  # fmt: skip


def assert_told_apart_within(pid: int, env: dict[str, str], seconds: float, hosts: dict[int, str]) -> None:
    """Asked once every rank is in its state, `top --once --json` tells them apart within `seconds`."""
    asked = time.monotonic()
    rows = wait_until(lambda: (r := top_json(pid, env)) and told_apart(r) and r, timeout=seconds,
                      what="top to tell the idle, spinning and holding ranks apart", every=0.1)  # fmt: skip
    assert time.monotonic() - asked < seconds
    assert {rank: row["host"] for rank, row in rows.items()} == hosts
    for row in rows.values():
        assert row["state"] == "running", row
        for key in ("steps_per_s", "gpu_util_percent", "gpu_memory_bytes", "last_output_age_s"):
            assert key in row, row
        assert isinstance(row["last_output_age_s"], float) and row["last_output_age_s"] < 3, row
        assert row["gpu_util_percent"] is None and row["gpu_memory_bytes"] is None  # no GPU here
