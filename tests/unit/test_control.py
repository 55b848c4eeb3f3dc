"""The control socket's directory, job discovery and one request answered (issue 17)."""

from __future__ import annotations

import json
import os
import select
import threading
from pathlib import Path

import pytest

from launcher.runtime.control import (
    REQUEST_TOP,
    ControlError,
    ControlServer,
    JobBusy,
    NoJob,
    SeveralJobs,
    answer,
    answer_busy,
    ask_stacks,
    ask_top,
    runtime_dir,
)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "distrun"


def test_the_runtime_directory_is_made_private(run_dir: Path) -> None:
    assert runtime_dir() == run_dir
    assert run_dir.stat().st_mode & 0o777 == 0o700


def test_a_directory_others_can_read_is_refused(run_dir: Path) -> None:
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)
    with pytest.raises(ControlError, match="is not a private directory of this user"):
        runtime_dir()


def test_no_job_is_exit_1_and_a_stale_socket_is_cleared(run_dir: Path) -> None:
    runtime_dir()
    stale = run_dir / "999999999.sock"
    stale.touch()
    with pytest.raises(NoJob, match="no running distrun job of yours") as caught:
        ask_stacks(None, 1.0)
    assert caught.value.exit_code == 1
    assert not stale.exists()
    with pytest.raises(NoJob, match="no distrun job of yours with pid 4242"):
        ask_stacks(4242, 1.0)


def test_several_jobs_are_listed_with_exit_2(run_dir: Path) -> None:
    runtime_dir()
    for pid in (os.getpid(), os.getppid()):
        (run_dir / f"{pid}.sock").touch()
    with pytest.raises(SeveralJobs, match=f"2 distrun jobs are running; .*{os.getpid()}: ") as caught:
        ask_stacks(None, 1.0)
    assert caught.value.exit_code == 2


def test_a_request_is_answered_over_the_socket(run_dir: Path) -> None:
    server = ControlServer()
    try:
        assert (server.path.stat().st_mode & 0o777) == 0o600
        got: list[str] = []
        client = threading.Thread(target=lambda: got.append(ask_stacks(None, 10.0)))
        client.start()
        select.select([server], [], [], 10.0)
        conn = server.accept()
        assert conn is not None
        answer(conn, "verdict: all is well\n")
        client.join(10.0)
        assert got == ["verdict: all is well\n"]
    finally:
        server.close()
    assert not server.path.exists()


def test_top_is_answered_with_the_live_view_or_what_the_job_does(run_dir: Path) -> None:
    server = ControlServer()
    try:
        for top, expected in (
            (None, {"pid": os.getpid(), "doing": "syncing", "ranks": []}),
            (
                lambda doing: json.dumps({"doing": doing, "ranks": [{"rank": 0}]}),
                {"doing": "syncing", "ranks": [{"rank": 0}]},
            ),
        ):
            server.top = top
            got: list[dict[str, object]] = []
            client = threading.Thread(target=lambda got=got: got.append(ask_top(os.getpid(), 10.0)))
            client.start()
            select.select([server], [], [], 10.0)
            accepted = server.accept_request()
            assert accepted is not None and accepted[1] == REQUEST_TOP
            server.answer_top(accepted[0], "syncing")
            client.join(10.0)
            assert got == [expected]
    finally:
        server.close()


def test_a_stacks_only_accept_refuses_a_top_request(run_dir: Path) -> None:
    server = ControlServer()
    try:
        failed: list[Exception] = []

        def ask() -> None:
            try:
                ask_top(os.getpid(), 10.0)
            except NoJob as err:
                failed.append(err)

        client = threading.Thread(target=ask)
        client.start()
        select.select([server], [], [], 10.0)
        assert server.accept() is None
        client.join(10.0)
        assert [str(e) for e in failed] == [f"distrun job {os.getpid()} ended before its samples were read"]
    finally:
        server.close()


def test_stacks_ask_again_while_the_job_is_briefly_busy_with_its_ranks_running(run_dir: Path) -> None:
    """A host joining a running job is reached and probed on the job's loop: `distrun stacks` asks again
    within its --wait, and gets the stacks once the loop is free; a job busy past the wait is one line."""
    server = ControlServer()
    try:
        got: list[str] = []
        client = threading.Thread(target=lambda: got.append(ask_stacks(None, 30.0)))
        client.start()
        for reply in ("busy", "busy", "stacks"):
            select.select([server], [], [], 10.0)
            conn = server.accept()
            assert conn is not None
            if reply == "busy":
                answer_busy(conn, "adding h4: waiting for the agents' answers", briefly=True)
            else:
                answer(conn, "rank 0 (1 of 1) on h1:\n")
        client.join(10.0)
        assert got == ["rank 0 (1 of 1) on h1:\n"]
        failed: list[JobBusy] = []

        def ask_briefly() -> None:
            try:
                ask_stacks(None, 0.5)
            except JobBusy as err:
                failed.append(err)

        client = threading.Thread(target=ask_briefly)
        client.start()
        while client.is_alive():
            if select.select([server], [], [], 0.1)[0]:
                conn = server.accept()
                assert conn is not None
                answer_busy(conn, "adding h4: connecting", briefly=True)
        [err] = failed
        assert err.exit_code == 75
        assert "is adding h4: connecting (its ranks run): ask again in a moment" in str(err)
    finally:
        server.close()
