"""`--host-discovery-script` polled while an elastic job runs, on local ranks: the script's slots on localhost
grow (a newcomer joins at the ranks' next commit, with rank 0's state; the others keep their processes) or
shrink (the rank beyond them exits 0; the others go on); a script that fails at its first call ends the job
in one line; later failures are retried.

The ranks (tests/integration/scripts/elastic_train.py with ELASTIC_WAIT_FOR_HOSTS) hold at batch 3 until the
host update reaches them, so the change lands mid-run without any sleep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import SCRIPTS, assert_all_gone, clean_env, run_distrun

SCRIPT = SCRIPTS / "elastic_train.py"
WAIT = clean_env(ELASTIC_WAIT_FOR_HOSTS="1")


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _results(out: Path, ranks: range) -> list[dict[str, object]]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in ranks]


def _pids(out: Path) -> dict[int, int]:
    return {int(p.read_text()): int(p.stem) for p in out.glob("*.start")}


def test_a_slot_the_script_adds_gets_a_newcomer_at_the_next_commit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # Both ranks opted in: the script offers a third slot.
    script = _script(tmp_path, f"[ -f {out}/opted.1 ] && echo localhost:3 || echo localhost:2\n")
    done = run_distrun(
        "--min-np", "1", "--max-np", "3", "--host-discovery-script", script, SCRIPT, out, "-1", "3", "8",
        env=WAIT, timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    pids = _pids(out)
    results = _results(out, range(3))
    assert [(got["rank"], got["size"], got["batch"]) for got in results] == [(0, 3, 8), (1, 3, 8), (2, 3, 8)]
    assert [got["pid"] for got in results[:2]] == [pids[0], pids[1]], "the survivors kept their processes"
    assert results[0]["sizes"] == results[1]["sizes"] == [3]
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"], "rank 0's state, synced"
    line = next(line for line in err.splitlines() if "reset 1:" in line)
    assert "hosts added: localhost (--host-discovery-script); left: none; joined: localhost" in line
    assert "world size 3" in line and "after the commit" in line
    assert "attempt 1" not in err, "no whole-job restart"
    assert_all_gone(list(pids.values()))


@pytest.mark.parametrize("late", [False, True], ids=["together", "rank-0-late"])
def test_a_slot_the_script_removes_lets_its_rank_exit_0_and_the_others_go_on(
    tmp_path: Path, late: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, f"[ -f {out}/opted.2 ] && echo localhost:2 || echo localhost:3\n")
    # rank-0-late: the update reaches rank 0 last, mid-run, so the others' commits consume theirs while
    # rank 0's view (which decides) has none: every rank must still raise at the same later commit.
    env = (
        clean_env(ELASTIC_WAIT_FOR_HOSTS="1", ELASTIC_LATE_UPDATE="0", ELASTIC_SLOW_S="0.5") if late else WAIT
    )
    done = run_distrun(
        "-np", "3", "--min-np", "1", "--host-discovery-script", script, SCRIPT, out, "-1", "3", "8",
        env=env, timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    pids = _pids(out)
    results = _results(out, range(2))
    assert [(got["rank"], got["size"], got["batch"], got["sizes"]) for got in results] == [
        (0, 2, 8, [2]),
        (1, 2, 8, [2]),
    ]
    assert [got["pid"] for got in results] == [pids[0], pids[1]]
    assert not (out / "2.json").exists(), "rank 2 left at the commit"
    assert "hosts removed: localhost (--host-discovery-script); left: rank 2 (on localhost)" in err
    assert any(line.split()[:3] == ["distrun:", "2", "0"] for line in err.splitlines()), "rank 2 exited 0"
    assert_all_gone(list(pids.values()))


def test_a_script_that_fails_at_its_first_call_ends_the_job_in_one_line(tmp_path: Path) -> None:
    script = _script(tmp_path, "echo 'no inventory' >&2\nexit 4\n")
    done = run_distrun(
        "--min-np", "1", "--max-np", "2", "--host-discovery-script", script, SCRIPT, tmp_path, "-1", "3",
        timeout=120,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.strip() == (
        f"distrun: error: --host-discovery-script {script} exited with code 4: no inventory"
    ), "one line, before anything started"
    assert not list(tmp_path.glob("*.start"))


def test_a_script_that_fails_at_its_first_poll_ends_the_running_job(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # It fails once the ranks run (its wait is the script's own, in the child the job's loop reads).
    script = _script(tmp_path, f"while [ ! -f {out}/opted.1 ]; do sleep 0.1; done\nexit 5\n")
    done = run_distrun(
        "-H", "localhost:2", "--min-np", "1", "--host-discovery-script", script, SCRIPT, out, "-1", "3", "8",
        env=clean_env(ELASTIC_SLOW_S="1"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert f"distrun: error: --host-discovery-script {script} exited with code 5 (its first call" in err
    assert "Traceback" not in err
    assert_all_gone(list(_pids(out).values()))


def test_later_failures_of_the_script_are_retried(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    calls = tmp_path / "calls"
    # Its first answer, then two failures once the ranks opted in, then the third slot.
    script = _script(
        tmp_path,
        f"""[ -f {out}/opted.1 ] || {{ echo localhost:2; exit 0; }}
echo x >> {calls}
[ "$(wc -l < {calls})" -le 2 ] && {{ echo 'inventory down' >&2; exit 3; }}
echo localhost:3
""",
    )
    done = run_distrun(
        "--min-np", "1", "--max-np", "3", "--host-discovery-script", script, SCRIPT, out, "-1", "3", "8",
        env=WAIT, timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.count("exited with code 3: inventory down; running it again in 1s") == 2
    assert [got["size"] for got in _results(out, range(3))] == [3, 3, 3]


def test_a_hosts_change_past_the_reset_limit_ends_the_job_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, f"[ -f {out}/opted.1 ] && echo localhost:3 || echo localhost:2\n")
    done = run_distrun(
        "--min-np", "1", "--max-np", "3", "--reset-limit", "0", "--host-discovery-script", script,
        SCRIPT, out, "-1", "3", "8", env=WAIT, timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1, err
    said = "distrun: error: the job ends: --reset-limit 0 reached (0 resets done); the next: hosts added"
    assert said in err
    assert "reset 1:" not in err and "attempt 1" not in err
    assert not list(out.glob("*.json")), "the ranks were stopped"
    assert_all_gone(list(_pids(out).values()))
