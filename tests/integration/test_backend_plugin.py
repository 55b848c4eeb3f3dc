"""A backend is one module and one table entry: a job launched end to end through a test's own backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.backends import api as backend
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.job.launch import launch
from tests import fake_backend
from tests.fakes import CapturedFd
from tests.support import SCRIPTS, clean_env, run_distrun


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


@pytest.fixture
def installed(tmp_path: Path) -> dict[str, str]:
    """An environment where an installed package declares tests/fake_backend.py as the `fake` backend."""
    site = tmp_path / "site"
    info = site / "distrun_fake-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: distrun-fake\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[distrun.backends]\nfake = tests.fake_backend\n")
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return env


def test_a_backend_from_an_entry_point_brings_its_option_and_its_hosts(
    tmp_path: Path, installed: dict[str, str]
) -> None:
    log, out = tmp_path / "opened.log", tmp_path / "out"
    out.mkdir()
    installed[fake_backend.HOSTS_VAR] = "fake-a:2,fake-b:1"
    done = run_distrun(
        "--launcher", "fake", "--fake-log", log, SCRIPTS / "envdump.py", out, env=installed
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert log.read_text() == "fake-a\nfake-b\n"
    ranks = {rank: json.loads((out / f"{rank}.json").read_text())["env"] for rank in range(3)}
    assert [ranks[r]["DISTRUN_HOSTNAME"] for r in range(3)] == ["fake-a", "fake-a", "fake-b"]


def test_a_backend_from_an_entry_point_is_named_by_the_environment_too(
    tmp_path: Path, installed: dict[str, str]
) -> None:
    log = tmp_path / "opened.log"
    installed.update(DISTRUN_LAUNCHER="fake", DISTRUN_FAKE_LOG=str(log))
    done = run_distrun("-H", "fake-x:1", "--dry-run", "true", env=installed)
    assert done.returncode == 0, done.stderr.decode()
    assert "launcher: fake" in done.stdout.decode()
    assert b"names no option" not in done.stderr
    done = run_distrun("-H", "fake-x:1", "true", env=installed)
    assert done.returncode == 0, done.stderr.decode()
    assert log.read_text() == "fake-x\n"


def test_a_backend_from_an_entry_point_is_named_by_a_config_file_too(
    tmp_path: Path, installed: dict[str, str]
) -> None:
    log, config = tmp_path / "opened.log", tmp_path / "distrun.yaml"
    config.write_text(f"launcher: fake\nfake-log: {log}\nhosts: [fake-y:1]\n")
    done = run_distrun("--config", config, "true", env=installed)
    assert done.returncode == 0, done.stderr.decode()
    assert log.read_text() == "fake-y\n"


def test_a_backends_options_show_in_help_only_once_it_is_named(installed: dict[str, str]) -> None:
    named = run_distrun("--launcher", "fake", "--help", env=installed)
    assert named.returncode == 0
    assert b"--fake-log FILE" in named.stdout and b"DISTRUN_FAKE_LOG" in named.stdout
    assert b"--ssh-port" in named.stdout
    plain = run_distrun("--help", env=installed)
    assert b"--fake-log" not in plain.stdout and b"--ssh-port" in plain.stdout
    check = run_distrun("check", "--launcher", "fake", "--help", env=installed)
    assert b"--fake-log" in check.stdout and b"--prefix" not in check.stdout


def test_a_backends_bad_option_value_is_one_line_naming_it(tmp_path: Path, installed: dict[str, str]) -> None:
    log = tmp_path / "nowhere" / "log"
    done = run_distrun("--launcher", "fake", "--fake-log", log, "-H", "fake-a", "true", env=installed)
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert lines == [
        f"distrun: error: --fake-log {tmp_path}/nowhere/log: {tmp_path}/nowhere is not a directory"
    ]


def test_without_hosts_of_its_own_the_backend_runs_on_this_machine(
    tmp_path: Path, installed: dict[str, str]
) -> None:
    done = run_distrun("--launcher", "fake", "-np", "2", "--dry-run", "true", env=installed)
    assert done.returncode == 0, done.stderr.decode()
    assert "2 processes on 1 host" in done.stdout.decode()
