"""Diagnosis meets a busy engine: ranks that run the engine's small-data paths back to back (a cached async
burst gathered as one fused buffer, a grouped call and a 64 KB allreduce riding in their rounds;
scripts/busy_engine.py) are asked for their stacks three times (their collectives seen moving, so the
verdict names no rank behind) and shown by `distrun top`, and go on passing with every sum right; then
Ctrl-C stops the job, exit 130, nothing left running. The test runs on two SSH hosts of the simulated
cluster too (tests/multihost)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.multihost.support import Where
from tests.support import (
    SCRIPTS,
    ask_stacks_until,
    assert_all_gone,
    never_left_running,
    recorded_pids,
    start_distrun,
    wait_for_files,
    wait_until,
)
from tests.top_helpers import top_json

SCRIPT = SCRIPTS / "busy_engine.py"
# The ranks import torch and agree their first rounds on a machine shared with other tests.
READY_WITHIN = 300


def _passes(out: Path) -> list[int]:
    return [int(path.read_text()) for path in sorted(out.glob("rank.*.passes"))]


def test_stacks_and_top_while_the_engine_is_busy_then_ctrl_c(tmp_path: Path, where: Where) -> None:
    env = where.env_with_own_runtime(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    job = start_distrun(*where.either(("-np", "2"), ("-H", "h1:1,h2:1")), SCRIPT, out, env=env)
    with never_left_running(job):
        wait_for_files(out, "rank.*.pid", 2, timeout=READY_WITHIN)
        answers = [ask_stacks_until(job.pid, "verdict: ", env) for _ in range(3)]
        for shown in answers:
            assert shown.startswith(f"stacks of 2 ranks on {where.either('1 host', '2 hosts')}:"), shown
            assert "could not be read" not in shown, shown
        # Each rank's records are read at its own moment, so they differ by an operation or a burst; seen
        # moving, they name no rank "behind" (it would be false: every rank is on its way).
        moved = [shown for shown in answers if "(process set 0, moving)" in shown]
        assert moved, answers
        assert not any("never issued it" in shown for shown in moved), moved
        assert all("collectives moving (process set 0): on their way, not stalled" in s for s in moved), moved
        assert set(top_json(job.pid, env)) == {0, 1}
        assert job.poll() is None, "asking for the stacks must not disturb the job"
        asked = _passes(out)
        # Still passing, every sum right (a wrong one ends its rank), after the asks.
        wait_until(
            lambda: all(now >= then + 3 for now, then in zip(_passes(out), asked, strict=True)),
            timeout=120,
            what=f"three more passes on both ranks after {asked}",
        )
        job.send_signal(signal.SIGINT)
        raw_out, raw_err = job.communicate(timeout=120)
    text = raw_out.decode() + raw_err.decode()
    assert job.returncode == 130, text
    assert "summed to" not in text and "AssertionError" not in text, text
    if where.ssh:
        where.assert_clean(within=10)
    else:
        assert_all_gone(recorded_pids(out))
