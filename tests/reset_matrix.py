"""Shared by the matrix of tools during an elastic reset, on local and SSH hosts: `distrun top`, `distrun
stacks`, then Ctrl-C or `--timeout`, in each phase of a reset (scripts/elastic_train.py holds the job in it).

Phases, as the job's `doing` says them: `commit`, the survivors' last commit (a survivor is paused in its
loop before its collective, so the reset never gets its RANK_READY); `sync`, the new world's first collective
(the survivors hold in their reset callback, after their new identity came)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

from tests.support import (
    SCRIPTS,
    Limit,
    ask_stacks_until,
    distrun_argv,
    never_left_running,
    start_distrun,
    wait_for_files,
    wait_until,
    with_timeouts,
)
from tests.top_helpers import top_json

SCRIPT = SCRIPTS / "elastic_train.py"
PHASES = ("commit", "sync")
ENDINGS = ("ctrl-c", "timeout")
# The phase: the job's `doing`, the environment that holds the job there, the marker files and how many, and
# the function its stacks show.
HOLDS = {
    "commit": ("the survivors' last commit", {"ELASTIC_HOLD_BEFORE_COMMIT": "1"}, "paused.*", 1,
               "paused_before_commit"),
    "sync": ("the new world's first collective", {"ELASTIC_HOLD_RESET": "1"}, "held.*", 2, "held"),
}  # fmt: skip
# The longest wait for the phase. --timeout of the timeout cells: the ranks start, one dies, the reset begins
# and the tools are asked before it runs out: inside the first on a machine shared with other tests (12-26 s
# measured at a load of 4), else inside the second (tests/support.with_timeouts).
PHASE_WITHIN = 90
TIMEOUTS = (40, 90)


def reset_cell(phase: str, ending: str, hosts: str, env: dict[str, str], out: Path) -> tuple[str, list[int]]:
    """One cell: a 3-rank elastic job on `hosts` whose start rank 2 dies at batch 3, held in `phase`; top and
    stacks answer there, and the job then ends by `ending` with its exit code (130 or 124). Its stderr and
    the pids its ranks had, for the caller to check that none is left."""
    if ending == "ctrl-c":
        return _held(phase, ending, hosts, env, out / "job")
    return with_timeouts(
        lambda limit: _held(phase, ending, hosts, env, out / f"t{limit.seconds}", limit=limit), *TIMEOUTS
    )


def _held(
    phase: str, ending: str, hosts: str, env: dict[str, str], out: Path, *, limit: Limit | None = None
) -> tuple[str, list[int]]:
    """The cell's job, its ranks' files in `out`, under `limit` where the ending is the timeout."""
    doing, hold, marker, count, frame = HOLDS[phase]
    out.mkdir()
    job = start_distrun("-H", hosts, "--min-np", "2", *(limit.option if limit else ()), SCRIPT, out, "2", "3",
                        "1000", env={**env, **hold})  # fmt: skip
    with never_left_running(job):
        with limit.before_it(job) if limit else contextlib.nullcontext():
            wait_for_files(out, marker, count, timeout=limit.seconds if limit else PHASE_WITHIN)

            def heading() -> str | None:
                top = distrun_argv("top", "--once", "--job", str(job.pid))
                done = subprocess.run(top, capture_output=True, env=env, timeout=30)
                assert done.returncode == 0, done.stderr.decode()
                first = done.stdout.decode().splitlines()[0]
                return first if f"waiting for {doing}" in first else None

            said = wait_until(heading, timeout=60, what=f"top to say the reset waits for {doing}", every=0.2)
            assert "resetting the world (rank 2 " in said and "2 ranks on" in said, said
            rows = top_json(job.pid, env)
            assert rows[2]["left"] and rows[2]["state"] == "left (killed SIGKILL)", rows[2]
            assert [rows[r]["world_rank"] for r in (0, 1)] == [0, 1]
            stacks = ask_stacks_until(job.pid, frame, env)
            assert frame in stacks and "Traceback" not in stacks, stacks
            assert job.poll() is None, "top and stacks leave the job running"
        if ending == "ctrl-c":
            job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=(limit.seconds if limit else 0) + 60)
    said = err.decode()
    assert job.returncode == (130 if ending == "ctrl-c" else 124), said
    assert "reset 1:" not in said, "the reset never completed"
    # The ranks' own KeyboardInterrupt is theirs (prefixed); distrun itself says one line, never a traceback.
    assert not [line for line in said.splitlines() if line.startswith("Traceback")], said
    return said, [int(p.stem) for p in out.glob("*.start")]
