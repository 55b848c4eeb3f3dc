"""The launcher's elastic driver on local ranks: an elastic job (--min-np) whose ranks all use hvd.elastic
keeps its survivors running through a SIGKILLed rank (same process, same state, a smaller world), says so in
one line and in the report (a conformance scenario: tests/conformance/test_scenarios.py); a loss while the
new world forms opens the round again (its newcomers leave and the survivors go on in a world formed once
more, still in their processes); --reset-limit ends the job naming the limit; Ctrl-C or --timeout during a
reset stops every rank.
"""

from __future__ import annotations

import json
import signal
from datetime import datetime
from pathlib import Path

import jsonschema
import pytest

from tests.support import (
    REPO,
    SCRIPTS,
    Limit,
    ask_stacks_until,
    assert_all_gone,
    clean_env,
    never_left_running,
    run_distrun,
    start_distrun,
    wait_for_files,
    with_timeouts,
)

SCRIPT = SCRIPTS / "elastic_train.py"
SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())


def started_pids(out: Path) -> dict[int, int]:
    """Start rank -> pid, from the files each rank wrote when it started."""
    return {int(p.read_text()): int(p.stem) for p in out.glob("*.start")}


def test_a_survivors_uncaught_exception_after_a_reset_has_torchs_rank_prefix_once(tmp_path: Path) -> None:
    """torch prefixes an uncaught exception's lines with "[rank<N>]: " from a hook each group formation
    installs; a survivor forms its group again at the reset, and must not print the prefix twice."""
    done = run_distrun(
        "-H", "localhost:3", "-np", "3", "--min-np", "2", SCRIPT, tmp_path, "2", "5",
        env=clean_env(ELASTIC_RAISE_AT_END="1"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode != 0, err
    assert "reset 1:" in err
    assert json.loads((tmp_path / "1.json").read_text())["sizes"] == [2], "rank 1 went through the reset"
    raised = [line for line in err.splitlines() if "RuntimeError: raised at the end by start rank 1" in line]
    assert raised, err
    assert all(line.count("[rank1]: ") == 1 for line in raised), raised
    assert "[rank1]: [rank1]:" not in err


def test_the_report_carries_each_reset_and_plot_marks_it_with_both_sizes(tmp_path: Path) -> None:
    from launcher.report.plot import load_report, picture

    report = tmp_path / "report.json"
    done = run_distrun(
        "-H", "localhost:3", "-np", "3", "--min-np", "2", "--report", report, SCRIPT, tmp_path, "2", "5",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, SCHEMA)
    [reset] = doc["resets"]
    assert (reset["size_before"], reset["size"]) == (3, 2)
    [mark] = picture(load_report(report), "report.json").resets
    assert mark.label == "reset 1: 3 -> 2 ranks"
    ended = datetime.fromisoformat(doc["ended"]) - datetime.fromisoformat(doc["origin"])
    assert 0 < mark.t < ended.total_seconds()
    svg = tmp_path / "run.svg"
    drawn = run_distrun("plot", report, "-o", svg)
    assert drawn.returncode == 0, drawn.stderr.decode()
    assert b"#ff8c00" in svg.read_bytes(), "the reset's dashed line (darkorange)"


@pytest.mark.parametrize("top_level", [False, True], ids=["elastic-script", "top-level-broadcast"])
def test_a_free_slot_refills_the_world_with_a_newcomer_holding_rank_0s_state(
    tmp_path: Path, top_level: bool
) -> None:
    """With a top-level broadcast of the model and optimizer (README's example, a Horovod script written for
    fixed worlds), the newcomer skips it until hvd.elastic.run, whose sync gives it the state: no mismatch,
    no restart, the committed progress kept."""
    report = tmp_path / "report.json"
    done = run_distrun(
        "-H", "localhost:4", "-np", "3", "--min-np", "2", "--report", report, SCRIPT, tmp_path, "2", "5",
        env=clean_env(**({"ELASTIC_TOP_LEVEL_BROADCAST": "1"} if top_level else {})), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "attempt 1" not in err and "MismatchError" not in err
    skipped = "broadcast_parameters before hvd.elastic.run in a rank that joined at a reset: skipped"
    assert (skipped in err) is top_level
    pids = started_pids(tmp_path)
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(3)]
    assert [(got["rank"], got["size"], got["batch"]) for got in results] == [
        (0, 3, 12),
        (1, 3, 12),
        (2, 3, 12),
    ]
    assert [got["pid"] for got in results[:2]] == [pids[0], pids[1]], "the survivors kept their processes"
    assert results[2]["pid"] != int((tmp_path / "killed").read_text()), "rank 2 is a newcomer"
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"]
    assert "joined: localhost; world size 3" in err
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, SCHEMA)
    [reset] = doc["resets"]
    assert (reset["hosts_joined"], reset["size"]) == (["localhost"], 3)
    assert [rank["rank"] for rank in doc["ranks"]] == [0, 1, 2, 3]


def test_a_rank_lost_while_the_new_world_forms_leaves_the_survivors_to_form_it_again(tmp_path: Path) -> None:
    done = run_distrun(
        "-H", "localhost:4", "-np", "4", "--min-np", "2", SCRIPT, tmp_path, "3", "2", "5",
        env=clean_env(ELASTIC_DIE_IN_RESET="2"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    pids = started_pids(tmp_path)
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    for rank, got in enumerate(results):
        assert got["pid"] == pids[rank], "the survivor kept its process through both worlds"
        assert (got["rank"], got["size"], got["batch"]) == (rank, 2, 5)
        assert got["sizes"] == [3, 2], "callbacks ran for the world that did not form, then this one"
    assert results[0]["weights"] == results[1]["weights"]
    assert "attempt 1" not in err and "no reset in place" not in err, "no whole-job restart"
    [line] = [line for line in err.splitlines() if "reset 1:" in line]
    assert "left: rank 3, rank 2 (on localhost); joined: none; world size 2" in line
    assert "reset 2:" not in err


def test_a_newcomer_lost_before_its_world_formed_leaves_the_survivors_to_form_another(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = run_distrun(
        "-H", "localhost:4", "-np", "3", "--min-np", "2", "--report", report, SCRIPT, tmp_path, "2", "2", "5",
        env=clean_env(ELASTIC_NEWCOMER_DIES="1"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "attempt 1" not in err and "no reset in place" not in err, "no whole-job restart"
    pids = started_pids(tmp_path)
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    for rank, got in enumerate(results):
        assert got["pid"] == pids[rank], "the survivor kept its process through both worlds"
        assert (got["rank"], got["size"], got["batch"], got["sizes"]) == (rank, 2, 5, [3, 2])
    assert results[0]["weights"] == results[1]["weights"]
    doc = json.loads(report.read_text())
    [reset] = doc["resets"]
    assert (reset["size"], reset["ranks_left"]) == (2, [2, 3]), "the newcomer failed: it counts as left"
    assert [rank["rank"] for rank in doc["ranks"]] == [0, 1, 2, 3]
    assert_all_gone([int(p.stem) for p in tmp_path.glob("*.start")])


def test_reset_limit_0_ends_the_job_naming_the_limit(tmp_path: Path) -> None:
    done = run_distrun(
        "-H", "localhost:3", "-np", "3", "--min-np", "2", "--reset-limit", "0", SCRIPT, tmp_path, "2", "5",
        timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode != 0, err
    assert "--reset-limit 0 reached" in err
    assert "reset 1:" not in err
    assert "attempt 1" not in err, "no whole-job restart either"


def test_ctrl_c_during_a_reset_stops_every_rank(tmp_path: Path) -> None:
    proc = start_distrun(
        "-H", "localhost:3", "-np", "3", "--min-np", "2", SCRIPT, tmp_path, "2", "5",
        env=clean_env(ELASTIC_HOLD_RESET="1"),
    )  # fmt: skip
    with never_left_running(proc):
        wait_for_files(tmp_path, "held.*", 2, timeout=240)
        # The reset is a state of the job's loop: `distrun stacks` answers meanwhile, with the ranks' stacks.
        assert "held" in ask_stacks_until(proc.pid, "held")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert_all_gone([int(p.stem) for p in tmp_path.glob("*.start")])


def test_timeout_during_a_reset_stops_every_rank(tmp_path: Path) -> None:
    """--timeout counts from the job's start and runs out while the survivors are held in their reset: 124,
    and nothing of the job left running. 30 s leave a lightly loaded machine time to reach the reset first,
    60 s a loaded one."""

    def attempt(limit: Limit) -> tuple[str, list[int]]:
        out = tmp_path / f"t{limit.seconds}"
        out.mkdir()
        proc = start_distrun(
            "-H", "localhost:3", "-np", "3", "--min-np", "2", *limit.option, SCRIPT, out, "2", "5",
            env=clean_env(ELASTIC_HOLD_RESET="1"),
        )  # fmt: skip
        with never_left_running(proc):
            with limit.before_it(proc):
                wait_for_files(out, "held.*", 2, timeout=limit.seconds)
            _, err = proc.communicate(timeout=limit.seconds + 60)
        said = err.decode()
        assert proc.returncode == 124, said
        assert "reset 1:" not in said, "the reset never completed: the timeout came during it"
        return said, [int(p.stem) for p in out.glob("*.start")]

    _, pids = with_timeouts(attempt, 30, 60)
    assert_all_gone(pids)
