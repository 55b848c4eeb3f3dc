"""The failure summary calls "stopped" only the ranks distrun signalled (issue 31, item 4): ranks that exit
at the same moment as the failing one, before the stop reaches them, are named with their own exits.

The ranks that end together wait on a shared lock the test holds, and leave with os._exit as soon as it is
released, so they exit within the same instant, well before distrun's stop can reach them."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from tests.support import start_distrun

# argv: the gate file, then the exit code of each rank ("wait": run until stopped).
_RANK = """
import fcntl, os, sys, time
gate, codes = sys.argv[1], sys.argv[2:]
code = codes[int(os.environ["RANK"])]
print("ready", flush=True)
if code == "wait":
    time.sleep(600)
with open(gate) as f:
    fcntl.flock(f, fcntl.LOCK_SH)
    os._exit(int(code))
"""


def _run_gated(tmp_path: Path, codes: list[str]) -> tuple[int, str]:
    gate = tmp_path / "gate"
    gate.touch()
    with gate.open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = start_distrun("-np", str(len(codes)), sys.executable, "-c", _RANK, gate, *codes)
        assert proc.stdout is not None
        ready = 0
        while ready < len(codes):
            line = proc.stdout.readline()
            assert line, "distrun ended before every rank was ready"
            ready += line.endswith(b"ready\n")
        fcntl.flock(held, fcntl.LOCK_UN)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return proc.returncode, err.decode()


def _expand(ranks: str) -> set[int]:
    found: set[int] = set()
    for part in ranks.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def _table(err: str) -> dict[int, str]:
    """Each rank's exit as the account's table shows it: a code, or the signal that ended it."""
    exits: dict[int, str] = {}
    for line in err.splitlines()[1:]:
        words = line.split()[1:]
        if line.startswith("distrun: ") and words and not words[0].isdigit():
            words = words[1:]  # the host column, on a host's first row
        if len(words) >= 3 and words[0].isdigit() and words[2].endswith("s"):
            exits[int(words[0])] = words[1]
    return exits


def _said(err: str) -> tuple[int, dict[int, str], set[int]]:
    """The summary's failing rank, the ranks it names with their own exit codes, and those it says stopped."""
    line = next(line for line in err.splitlines() if " (host localhost) exited with code " in line)
    first, *parts = line.removeprefix("distrun: ").split("; ")
    own: dict[int, str] = {}
    stopped: set[int] = set()
    for part in parts:
        if part.startswith("stopped "):
            stopped |= _expand(part.split()[2])
        else:
            words = part.split()
            assert words[2:5] == ["exited", "with", "code"], line
            own.update(dict.fromkeys(_expand(words[1]), words[5]))
    return int(first.split()[1]), own, stopped


def _check_consistent(err: str, failed_code: str) -> tuple[int, dict[int, str], set[int]]:
    """What the summary says of each rank agrees with the table: a rank that shows an exit code exited on
    its own and is named with it; only a rank the stop's SIGTERM ended is called stopped."""
    table = _table(err)
    failed, own, stopped = _said(err)
    assert table[failed] == failed_code, err
    assert stopped == {r for r, shown in table.items() if shown == "SIGTERM"}, err
    assert all(table[r] == code for r, code in own.items()), err
    return failed, own, stopped


def test_ranks_that_exit_1_together_are_not_called_stopped(tmp_path: Path) -> None:
    code, err = _run_gated(tmp_path, ["1", "1", "1", "wait"])
    assert code == 1, err
    failed, own, stopped = _check_consistent(err, "1")
    assert 3 in stopped and failed in range(3), err
    # The three were released together: those the summary does not name as failing or stopped exited 1.
    assert set(own) | stopped | {failed} == {0, 1, 2, 3}, err


def test_a_rank_that_exits_0_as_another_fails_is_not_called_stopped(tmp_path: Path) -> None:
    code, err = _run_gated(tmp_path, ["0", "1", "wait"])
    assert code == 1, err
    failed, own, stopped = _check_consistent(err, "1")
    assert failed == 1 and 2 in stopped, err
    # Rank 0's exit arrived before rank 1's (then it is not named) or after (then named with its exit 0).
    assert own in ({}, {0: "0"}) or 0 in stopped, err
