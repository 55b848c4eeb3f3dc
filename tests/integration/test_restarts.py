"""--max-restarts with real processes: whole-job restarts, fresh rendezvous, what never restarts."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.support import (
    REPO,
    SCRIPTS,
    assert_all_gone,
    recorded_pids,
    run_distrun,
    start_distrun,
    wait_for_files,
)

RESTARTABLE = SCRIPTS / "restartable.py"


def _env(out: Path, attempt: int, rank: int) -> dict[str, str]:
    data: dict[str, str] = json.loads((out / f"a{attempt}.r{rank}.json").read_text())
    return data


def test_a_failed_attempt_restarts_with_fresh_rendezvous_and_counters(tmp_path: Path) -> None:
    result = run_distrun(
        "-np", "2", "--max-restarts", "2", "--restart-delay", "0.1",
        RESTARTABLE, "--out", tmp_path, "--fail", "0:1:3",
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    # Rank 1 wrote its file before failing; rank 0 of attempt 0 may have been stopped before writing its own.
    first, second = _env(tmp_path, 0, 1), _env(tmp_path, 1, 1)
    assert second["DISTRUN_RESTART_COUNT"] == second["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert second["TORCHELASTIC_MAX_RESTARTS"] == "2"
    assert first["MASTER_PORT"] != second["MASTER_PORT"]
    assert second["DISTRUN_RUN_ID"] == first["DISTRUN_RUN_ID"]
    assert "attempt 0 failed: rank 1 (host localhost) exited with code 3; restarting" in err
    assert "2 attempts:" in err and "attempt 1: 2 ranks on localhost: succeeded" in err
    assert not (tmp_path / "a2.r0.json").exists()


def test_without_max_restarts_a_failure_ends_the_job_as_before(tmp_path: Path) -> None:
    result = run_distrun("-np", "2", RESTARTABLE, "--out", tmp_path, "--fail", "0:1:3")
    err = result.stderr.decode()
    assert result.returncode == 3
    assert "restarting" not in err and "attempts" not in err
    assert not (tmp_path / "a1.r0.json").exists()


def test_a_restart_keeps_oversubscribe(tmp_path: Path) -> None:
    result = run_distrun(
        "-np", "3", "-H", "localhost:2", "--oversubscribe", "--max-restarts", "1", "--restart-delay", "0",
        RESTARTABLE, "--out", tmp_path, "--fail", "0:1:3",
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert "attempt 1: 3 ranks on localhost: succeeded" in err
    assert {_env(tmp_path, 1, rank)["WORLD_SIZE"] for rank in range(3)} == {"3"}


def test_when_restarts_run_out_the_last_failure_decides_the_exit_code(tmp_path: Path) -> None:
    result = run_distrun(
        "-np", "1", "--max-restarts", "1", "--restart-delay", "0",
        RESTARTABLE, "--out", tmp_path, "--fail", "0:0:4", "--fail", "1:0:5",
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 5, err
    assert "no restarts left (1 restart used)" in err
    assert "attempt 0: 1 rank on localhost: rank 0 (host localhost) exited with code 4" in err


def test_ctrl_c_during_a_restarted_attempt_does_not_restart(tmp_path: Path) -> None:
    proc = start_distrun(
        "-np", "2", "--max-restarts", "3", "--restart-delay", "0",
        RESTARTABLE, "--out", tmp_path, "--fail", "0:0:1", "--wait-attempt", "1",
    )  # fmt: skip
    wait_for_files(tmp_path, "a1.r*.pid", 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert not (tmp_path / "a2.r0.json").exists()
    assert_all_gone(recorded_pids(tmp_path))


def test_the_example_training_killed_mid_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    checkpoint, metrics = tmp_path / "ck.pt", tmp_path / "metrics.json"
    proc = start_distrun(
        "-np", "2", "--max-restarts", "1", "--restart-delay", "0", REPO / "examples" / "train.py",
        "--epochs", "4", "--data", "synthetic", "--checkpoint", checkpoint, "--json-out", metrics,
    )  # fmt: skip
    wait_for_files(tmp_path, "ck.pt", 1, timeout=120)  # epoch 1 is on disk: kill a rank mid-run
    victim = next(
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "train.py" in " ".join(p.cmdline()) and p.environ().get("RANK") == "1"
    )
    victim.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert "rank 1 (host localhost) was killed by SIGKILL" in err.decode()
    result = json.loads(metrics.read_text())
    assert result["start_epoch"] >= 1 and result["epoch"] == 3


def test_timeout_holds_during_a_restart_delay(tmp_path: Path) -> None:
    """--timeout 2 with a 30 s restart delay: exit 124 at the deadline, and no new attempt."""
    report = tmp_path / "r.json"
    started = time.monotonic()
    result = run_distrun(
        "-np", "1", "--timeout", "2", "--max-restarts", "5", "--restart-delay", "30", "--report", report,
        RESTARTABLE, "--out", tmp_path, "--fail", "0:0:3",
    )  # fmt: skip
    took = time.monotonic() - started
    err = result.stderr.decode()
    assert result.returncode == 124, err
    assert took < 25, f"took {took:.1f}s: the restart delay outlived --timeout"
    assert not (tmp_path / "a1.r0.json").exists(), "no attempt started after the deadline"
    assert "timed out after 2s" in err
    doc = json.loads(report.read_text())
    assert (doc["outcome"], doc["exit_code"]) == ("timed-out", 124)
    assert doc["failure"]["detail"].startswith("timed out after 2s")


@pytest.mark.parametrize("hosts", [(), ("-H", "localhost:1")], ids=["first-call", "between-attempts"])
def test_timeout_holds_during_a_slow_discovery_script(tmp_path: Path, hosts: tuple[str, ...]) -> None:
    """The deadline also bounds the host discovery (it would otherwise wait 30 s): its first call, where the
    job starts on the hosts it lists, and between attempts."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    started = time.monotonic()
    result = run_distrun(
        *hosts, "-np", "1", "--min-np", "1", "--timeout", "2", "--restart-delay", "0",
        "--host-discovery-script", script, RESTARTABLE, "--out", tmp_path, "--fail", "0:0:3",
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 124, result.stderr.decode()
    assert took < 25, f"took {took:.1f}s: discovery outlived --timeout"
