"""The end-of-run account and --report, from real runs: success, failure and timeout (issue 10)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support import REPO, SCRIPTS, clean_env, distrun_argv, run_distrun

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
# A rank that holds ~40 MB and burns a little CPU, so the measured figures have something to show.
WORK = "b = bytearray(40 << 20); sum(range(2_000_000))"


def report_of(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, SCHEMA)
    return doc


def test_success_prints_the_account_and_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    result = run_distrun(
        "-np", "2", "--report", report, "--output-dir", tmp_path / "logs", "python", "-c", WORK
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    lines = err.splitlines()
    assert lines[0].split() == ["distrun:", "host", "rank", "exit", "wall", "peak", "RSS", "CPU"]
    assert lines[1].split()[1:4] == ["localhost", "0", "0"]
    doc = report_of(report)
    assert (doc["outcome"], doc["exit_code"], doc["restarts"], doc["failure"]) == ("succeeded", 0, 0, None)
    assert doc["command"] == ["python", "-c", WORK]
    assert len(doc["run_id"]) == 12
    for rank, entry in enumerate(doc["ranks"]):
        assert (entry["rank"], entry["host"], entry["exit_code"], entry["signal"]) == (
            rank,
            "localhost",
            0,
            None,
        )
        assert entry["pid"] > 0
        assert entry["peak_rss_bytes"] > 40 << 20, "the 40 MB the rank holds"
        assert entry["cpu_seconds"] > 0 and entry["wall_seconds"] >= entry["cpu_seconds"] * 0.5
        assert entry["logs"] == {
            "stdout": str(tmp_path / "logs" / f"rank.{rank}" / "stdout"),
            "stderr": str(tmp_path / "logs" / f"rank.{rank}" / "stderr"),
        }
    assert doc["attempts"][0]["ranks"] == doc["ranks"]


def test_failure_report_names_the_rank_and_its_stderr(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    result = run_distrun(
        "-np", "3", "--report", report, SCRIPTS / "behave.py", "--pid-dir", pid_dir, "--fail-rank", "1",
        "--code", "5",
    )  # fmt: skip
    assert result.returncode == 5
    doc = report_of(report)
    assert (doc["outcome"], doc["exit_code"]) == ("rank-failed", 5)
    assert doc["failure"]["rank"] == 1 and doc["failure"]["host"] == "localhost"
    assert doc["failure"]["stderr_tail"] == ["rank 1 is failing on purpose"]
    assert doc["failure"]["detail"].startswith("rank 1 (host localhost) exited with code 5")
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    assert by_rank[1]["exit_code"] == 5
    assert {by_rank[0]["signal"], by_rank[2]["signal"]} == {"SIGTERM"}, "the others were stopped"
    err = result.stderr.decode()
    assert err.index("peak RSS") < err.index("rank 1 (host localhost) exited with code 5"), (
        "table, then summary"
    )


def test_timeout_report(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    result = run_distrun(
        "-np", "2", "--timeout", "3", "--report", report, SCRIPTS / "behave.py", "--pid-dir", pid_dir
    )
    assert result.returncode == 124
    doc = report_of(report)
    assert (doc["outcome"], doc["exit_code"]) == ("timed-out", 124)
    assert doc["failure"]["rank"] is None and "timed out after 3s" in doc["failure"]["detail"]
    assert all(r["signal"] == "SIGTERM" for r in doc["ranks"])


def test_single_rank_run_prints_no_table_but_still_reports(tmp_path: Path) -> None:
    report = tmp_path / "one.json"
    result = run_distrun("--report", report, "python", "-c", "pass")
    assert result.returncode == 0
    assert result.stderr == b""
    assert len(report_of(report)["ranks"]) == 1


def test_stale_torchelastic_agent_store_does_not_hang_a_local_gloo_job() -> None:
    env = clean_env(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="outer", RANK="5")
    result = run_distrun("-np", "2", "--timeout", "60", SCRIPTS / "allreduce.py", env=env)
    assert result.returncode == 0, result.stderr.decode()
    assert "sum=3" in result.stdout.decode()


def test_missing_script_is_127_before_anything_starts(tmp_path: Path) -> None:
    result = run_distrun("-np", "2", "no_such_script.py", cwd=tmp_path)
    assert result.returncode == 127
    assert result.stderr.decode() == (
        f"distrun: error: host localhost: no_such_script.py not found in {tmp_path} there\n"
    )


def test_another_user_on_this_machine_is_not_run_as_me(tmp_path: Path) -> None:
    """`nobody@localhost` must go through SSH as nobody; it never silently runs as the current user."""
    marker = tmp_path / "ran"
    env = {**clean_env(), "HOME": str(tmp_path)}  # no keys: SSH cannot log in as nobody
    result = run_distrun("-H", "nobody@localhost", "--ssh-connect-timeout", "5", "touch", marker, env=env)
    assert result.returncode == 3
    assert not marker.exists()
    # Here no sshd listens on localhost; with one, SSH would refuse nobody's login: exit 3 either way.
    assert result.stderr.decode().startswith("distrun: error: localhost: ")


STALE = '{"outcome": "succeeded", "exit_code": 0}\n'


def test_every_run_given_report_writes_it_whatever_ends_it(tmp_path: Path) -> None:
    """An earlier run's report never survives a later run that ended early (issue 19, defect 2)."""
    cases = {
        # A missing script: refused on the host before anything starts (127).
        "missing-script": (("no_such_script.py",), 127, "no_such_script.py not found"),
        # A host that cannot be reached (no sshd answers as nobody on this machine: exit 3).
        "unreachable": (("-H", "nobody@localhost", "--ssh-connect-timeout", "5", "true"), 3, "localhost"),
    }
    env = {**clean_env(), "HOME": str(tmp_path)}  # no SSH keys: the login can only fail
    for name, (args, code, said) in cases.items():
        report = tmp_path / f"{name}.json"
        report.write_text(STALE)
        result = run_distrun("--report", report, *args, env=env, cwd=tmp_path)
        assert result.returncode == code, (name, result.stderr.decode())
        doc = report_of(report)
        assert (doc["outcome"], doc["exit_code"], doc["attempts"], doc["ranks"]) == (
            "not-started",
            code,
            [],
            [],
        )
        assert said in doc["failure"]["detail"]
        assert doc["failure"]["detail"] in result.stderr.decode(), "the report says what the console said"


def test_success_after_a_restart_has_no_failure(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    out = tmp_path / "out"
    out.mkdir()
    result = run_distrun(
        "-np", "2", "--max-restarts", "1", "--restart-delay", "0", "--report", report,
        SCRIPTS / "restartable.py", "--out", out, "--fail", "0:1:4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    doc = report_of(report)
    assert (doc["outcome"], doc["restarts"], doc["failure"]) == ("succeeded", 1, None)
    assert [a["outcome"] for a in doc["attempts"]] == ["rank-failed", "succeeded"]


def test_report_through_a_symlink_and_refusal_of_a_fifo(tmp_path: Path) -> None:
    """End to end: a symlink stays and its target gets the report; a FIFO is refused before the run."""
    (tmp_path / "real.json").write_text(STALE)
    (tmp_path / "link.json").symlink_to("real.json")
    result = run_distrun("--report", tmp_path / "link.json", "true")
    assert result.returncode == 0, result.stderr.decode()
    assert (tmp_path / "link.json").is_symlink()
    assert report_of(tmp_path / "real.json")["outcome"] == "succeeded"

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = run_distrun("--report", fifo, "true")
    assert result.returncode == 2
    assert (
        result.stderr.decode()
        == f"distrun: error: --report {fifo}: is a FIFO, not a regular file; give a file name\n"
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_disk_that_fills_during_the_run_takes_the_report_and_no_temporary_file(tmp_path: Path) -> None:
    """On a real file system that fills up during the run (a 64 KiB tmpfs in a mount namespace of the test's
    own; rank 0 fills it): the room held since the start takes the report, and no .NAME.PID.tmp is left
    (issue 19, defect 1; issue 31, item 2: the earlier report is not kept). A file system full before the run
    is refused at the start, a report that outgrows the held room exits 4
    (tests/integration/test_report_full_disk.py)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    fill = f'[ "$RANK" != 0 ] || head -c 1000000 /dev/zero > {disk}/filler 2>/dev/null; true'
    argv = " ".join(
        shlex.quote(a) for a in distrun_argv("--report", disk / "r.json", "-np", "2", "sh", "-c", fill)
    )
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} && printf old > {disk}/r.json && {argv}; "
        f"echo rc=$?; ls -A {disk}; cat {disk}/r.json"
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, env=clean_env(), cwd=REPO, timeout=120,
    )  # fmt: skip
    out, err = result.stdout.decode(), result.stderr.decode()
    assert "rc=0" in out, err
    assert "cannot write the report" not in err, "the room held from the start takes the report"
    assert out.splitlines()[1:3] == ["filler", "r.json"], out
    assert out.splitlines()[3] == "{", "this run's report, not the earlier one"
