"""The agent's side of a rank's collectives (launcher.agent.progress): reading an answer, torch's trace made
into the same records, a sample's few fields; and the answer hook, run in a real rank-like process, answering
through its FIFO only when asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.agent.progress import (
    ANSWER_MODULE,
    ANSWER_SOURCE,
    ask,
    read,
    records_of,
    summary,
    trace_records,
)
from tests.support import REPO, wait_until

# The JSON form of torch 2.13's flight recorder after one gloo all_reduce (trimmed to what is read).
TRACE = {
    "entries": [
        {"collective_seq_id": 1, "is_p2p": False, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:all_reduce"},
        {"collective_seq_id": 2, "is_p2p": False, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:barrier"},
        {"collective_seq_id": 0, "is_p2p": True, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:send"},
    ],
    "pg_status": {"0": {"last_completed_collective": "1", "last_enqueued_collective": "2",
                        "last_started_collective": "-1"}},
}  # fmt: skip


def test_torchs_trace_gives_the_last_enqueued_and_completed_per_process_group() -> None:
    assert trace_records(TRACE) == [
        {
            "process_set": 0,
            "issued": {"seq": 2, "kind": "barrier", "name": "gloo:barrier"},
            "done": {"seq": 1, "kind": "all_reduce", "name": "gloo:all_reduce"},
        }
    ]
    assert trace_records({"pg_status": {"0": {"last_enqueued_collective": "-1"}}}) == [
        {"process_set": 0, "issued": None, "done": None}
    ]
    assert trace_records({"entries": ["junk", {"process_group": None}], "pg_status": {"1": "junk"}}) == []


def test_an_answer_gives_collectives_records_else_torchs_else_a_note() -> None:
    mine = {"process_set": 0, "issued": None, "done": None}
    assert records_of({"records": [mine, "junk"]}) == [mine]
    made = records_of({"records": [], "torch": {"backend": "gloo", "trace": TRACE}})
    assert made is not None and made[0]["source"] == "torch (gloo)" and made[0]["issued"]["seq"] == 2
    assert records_of({"records": [], "torch": {"backend": "gloo", "note": "no trace: off"}}) == [
        {"source": "torch (gloo)", "note": "no trace: off"}
    ]
    assert records_of({"records": [], "torch": None}) == []
    assert records_of("junk") is None
    noted = records_of({"records": [], "error": "ValueError: x"})
    assert noted is not None and "could not tell its collectives: ValueError: x" in noted[0]["note"]


def test_a_samples_fields_come_from_the_global_sets_record() -> None:
    records = [
        {"process_set": 1, "issued": {"seq": 9, "name": "other"}, "done": None},
        {"process_set": 0, "issued": {"seq": 5, "kind": "allreduce", "name": "g"}, "done": {"seq": 4}},
    ]
    assert summary(records) == {"collective_issued": 5, "collective_done": 4, "collective_name": "g"}
    assert summary([{**records[1], "moving": True}])["collective_moving"] is True
    assert summary([{"process_set": 0, "issued": None, "done": None}]) == {
        "collective_issued": 0,
        "collective_done": 0,
    }
    assert summary(None) == {} and summary([{"note": "no trace"}]) == {}


RANK = """
import sys, time
import collectives.progress as progress
record = progress.progress_for(0)
record.issued_seq, record.issued_kind, record.issued_name = 3, "ALLREDUCE", "grad.w"
record.done_seq, record.done_kind, record.done_name = 2, "ALLREDUCE", "grad.v"
print("ready", flush=True)
time.sleep(60)
"""


def test_the_hook_answers_through_its_fifo_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / f"{ANSWER_MODULE}.py").write_text(ANSWER_SOURCE)
    env = {
        **os.environ,
        "DISTRUN_STACK_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]),
        "PYTHONWARNINGS": f"ignore::{ANSWER_MODULE}.Never",
    }
    proc = subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert read(str(tmp_path), proc.pid) is None, "nothing written before anybody asks"
        assert ask(str(tmp_path), proc.pid, fresh=True)
        answered = wait_until(lambda: read(str(tmp_path), proc.pid), what="the rank's answer")
        records: list[dict[str, Any]] = answered or []
        assert records[0]["issued"] == {"seq": 3, "kind": "allreduce", "name": "grad.w"}
        assert records[0]["done"]["seq"] == 2
        assert records[0]["moving"] is False, "a rank whose record stays put is not on its way"
        assert not (tmp_path / f"{proc.pid}.progress.tmp").exists()
        # Asked again, it answers again (the file replaced whole, never half-written).
        os.unlink(tmp_path / f"{proc.pid}.progress")
        wait_until(lambda: ask(str(tmp_path), proc.pid), what="the thread back at its FIFO")
        wait_until((tmp_path / f"{proc.pid}.progress").exists, what="the second answer")
        assert json.loads((tmp_path / f"{proc.pid}.progress").read_text())["records"]
    finally:
        proc.kill()
        proc.wait()
    assert not ask(str(tmp_path), proc.pid), "a gone rank has no reader: the ask fails at once"
    assert not ask(str(tmp_path), 1), "a process without the hook: no FIFO"


def test_a_record_that_changes_while_it_is_read_is_moving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy set's records change between one rank's reading and another's: `snapshot` says which moved
    within its window, so that the verdict accuses nobody there (launcher.diagnose.collective_verdict)."""
    from collectives import progress

    still, busy = progress.progress_for(98), progress.progress_for(99)
    still.done_seq = still.issued_seq = busy.issued_seq = 5

    def the_rank_runs_on(seconds: float) -> None:
        assert seconds == progress.MOVING_WINDOW
        busy.done_seq = 5  # its operation completes while the records are watched

    monkeypatch.setattr(progress.time, "sleep", the_rank_runs_on)
    try:
        moving = {r["process_set"]: r["moving"] for r in progress.snapshot()["records"]}
        assert moving[98] is False and moving[99] is True
        assert not any(r["moving"] for r in progress.snapshot(window=0)["records"])
    finally:
        del progress._progress[98], progress._progress[99]
