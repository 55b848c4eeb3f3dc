"""The collective, named (issue 38): one of 4 ranks never issues a named allreduce, or has issued nothing
since init(); `distrun stacks` prints each rank's last collective issued and completed, and a verdict naming
the rank behind, the tensor and both sequence numbers; `distrun top --json` shows the sequence numbers and
marks the rank behind; the stall warning names the tensor as Horovod does. A plain torch.distributed script
shows torch's own trace, or says in one line that it has none."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from tests.support import (
    SCRIPTS,
    ask_stacks_until,
    clean_env,
    distrun_argv,
    never_left_running,
    wait_for_files,
    wait_until,
)
from tests.top_helpers import top_json

SKIP = SCRIPTS / "skip_allreduce.py"
STALL_S = 4
CASES = {
    "skip": (
        "verdict: ranks 0-2 wait in allreduce `grad.layer4.weight` (#7, process set 0); rank 3 never issued "
        "it: its last completed is #6; rank 3's stack: data_loader, skip_allreduce.py:18",
        "  collectives: last issued allreduce `grad.layer3.bias` (#6), last completed #6 (process set 0)",
        "rank 3 missing ['grad.layer4.weight']",
        (6, 6, 7),
    ),
    "idle": (
        "verdict: ranks 0-2 wait in allreduce `only_me` (#1, process set 0); rank 3 never issued it: it has "
        "issued no collective since init(); rank 3's stack: data_loader, skip_allreduce.py:18",
        "  collectives: last issued none since init(), last completed none (process set 0)",
        "rank 3 missing ['only_me']",
        (0, 0, 1),
    ),
}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_the_verdict_names_the_rank_behind_the_tensor_and_both_sequence_numbers(
    tmp_path: Path, mode: str
) -> None:
    verdict, rank3_line, stall, (issued3, done3, issued_others) = CASES[mode]
    out = tmp_path / "out.txt"
    env = clean_env(HOROVOD_STALL_CHECK_TIME_SECONDS=str(STALL_S))
    with out.open("wb") as sink:
        job = subprocess.Popen(
            distrun_argv("-np", "4", "python", SKIP, tmp_path, mode), stdout=sink, stderr=sink, env=env
        )
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 4)
        # The records come from the engines, not from the stall check: the verdict is there once the ranks
        # block, whatever the stall warning's time.
        shown = ask_stacks_until(job.pid, verdict, env)
        assert verdict in shown.splitlines(), shown
        lines = shown.splitlines()
        assert lines[lines.index("rank 3 (1 of 4) on localhost:") + 1] == rank3_line, shown
        assert "distrun_progresshook" not in shown, "the thread that answers is distrun's, not shown"

        # Each rank's record comes with its own samples: once every rank's is in, rank 3 is behind.
        def marked() -> dict[int, dict[str, object]] | None:
            rows = top_json(job.pid, env)
            complete = all(row.get("collective_issued") is not None for row in rows.values())
            return rows if complete and rows[3].get("collectives_behind") else None

        rows = wait_until(marked, timeout=60, what="top to hold every rank's record and mark rank 3 behind")
        assert rows[3]["collective_issued"] == issued3 and rows[3]["collective_done"] == done3, rows[3]
        assert rows[3]["collectives_behind"] == issued_others - issued3, rows[3]
        for rank in range(3):
            assert rows[rank]["collective_issued"] == issued_others, rows[rank]
            assert rows[rank]["collectives_behind"] is None, rows[rank]
        # Horovod's stall warning, with the tensor's name, from a rank that submitted it.
        wait_until(lambda: stall in out.read_text(), timeout=60, what="the stall warning")
        assert "key " not in out.read_text()
        assert job.poll() is None, "diagnosis must not end the job"


def test_a_torch_distributed_script_without_a_trace_is_said_so_in_one_line(tmp_path: Path) -> None:
    """scripts/hang.py uses torch.distributed's gloo directly, with torch's flight recorder off."""
    job = subprocess.Popen(
        distrun_argv("-np", "4", "python", SCRIPTS / "hang.py", tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 4)
        note = "collectives: no trace: torch's flight recorder is off"
        shown = ask_stacks_until(job.pid, note, clean_env())
        assert any(line.strip().startswith(note) for line in shown.splitlines()), shown
        assert "verdict: 3 ranks wait in a collective (barrier)" in shown, shown


@pytest.mark.skipif(
    tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
    reason="torch's flight recorder records gloo's collectives from torch 2.13 on",
)
def test_a_torch_distributed_script_with_its_flight_recorder_shows_its_columns(tmp_path: Path) -> None:
    """The same script with TORCH_FR_BUFFER_SIZE set: torch's own trace gives each rank's last collective
    enqueued and completed, and the verdict names rank 2, which never entered the barrier."""
    env = clean_env(TORCH_FR_BUFFER_SIZE="64")
    job = subprocess.Popen(
        distrun_argv("-np", "4", "python", SCRIPTS / "hang.py", tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    with never_left_running(job):
        wait_for_files(tmp_path, "*.pid", 4)
        shown = ask_stacks_until(job.pid, "rank 2 never issued it", env)
        assert "rank 2 never issued it" in shown, shown
        assert "torch (gloo)" in shown, shown
