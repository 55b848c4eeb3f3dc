"""A backend is one module and one table entry: a job launched end to end through a test's own backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.backends import api as backend
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.job.run import launch
from tests import fake_backend
from tests.fakes import CapturedFd
from tests.support import SCRIPTS


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backend.BACKENDS, "fake", "tests.fake_backend")
    monkeypatch.setattr(fake_backend, "OPENED", [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # gloo, whatever GPUs this machine has


@pytest.mark.usefixtures("fake")
def test_a_job_runs_end_to_end_through_a_backend_from_the_table(tmp_path: Path) -> None:
    hosts = (Host("fake-a", slots=2), Host("fake-b", slots=1))
    config = LaunchConfig(
        command=(str(SCRIPTS / "envdump.py"), str(tmp_path)), hosts=hosts, num_proc=3, launcher="fake"
    )
    out, err = CapturedFd(), CapturedFd()
    assert launch(config, out.fileno(), err.fileno()) == 0, err.getvalue().decode()
    assert fake_backend.OPENED == ["fake-a", "fake-b"]
    ranks = {rank: json.loads((tmp_path / f"{rank}.json").read_text())["env"] for rank in range(3)}
    assert [ranks[r]["DISTRUN_HOSTNAME"] for r in range(3)] == ["fake-a", "fake-a", "fake-b"]
    assert [ranks[r]["LOCAL_RANK"] for r in range(3)] == ["0", "1", "0"]
    assert {env["MASTER_ADDR"] for env in ranks.values()} == {"127.0.0.1"}
    assert ranks[0]["DISTRUN_RUN_ID"] == ranks[2]["DISTRUN_RUN_ID"]


def test_an_unknown_backend_is_a_usage_error_in_the_cli() -> None:
    from tests.support import run_distrun

    done = run_distrun("--launcher", "nosuch", "true")
    assert done.returncode == 2
    assert b"--launcher" in done.stderr and b"nosuch" in done.stderr
