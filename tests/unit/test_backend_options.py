"""Backends' own options and host sources through the CLI, in-process: declarations made click options,
`--launcher` read before parsing, which backend's hosts a launch without -H gets."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from launcher.backends import api
from launcher.backends.options import BackendOption
from launcher.backends.ssh.options import ssh_options
from launcher.cli.backend_options import click_option, named_launcher
from launcher.cli.main import Request, _parse, cli
from launcher.core.hosts import Host
from launcher.errors import UsageError
from tests import fake_backend


@pytest.fixture(autouse=True)
def no_distrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith(("DISTRUN_", "SLURM_", fake_backend.HOSTS_VAR))]:
        monkeypatch.delenv(name)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(api.BACKENDS, "fake", "tests.fake_backend")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--launcher", "fake", "train.py"], "fake"),
        (["-np", "2", "--launcher=fake", "train.py"], "fake"),
        (["-H", "--launcher", "train.py"], None),  # -H's value, then the command
        (["-x", "A=1", "-v", "--launcher", "srun", "t.py"], "srun"),
        (["train.py", "--launcher", "fake"], None),  # the command's own argument
        (["--", "--launcher", "fake"], None),
    ],
)
def test_the_launcher_is_read_before_parsing_as_click_will(argv: list[str], named: str | None) -> None:
    assert named_launcher(argv, cli.params, {}) == named


def test_the_environment_names_the_launcher_when_the_command_line_does_not() -> None:
    assert named_launcher(["t.py"], cli.params, {"DISTRUN_LAUNCHER": "fake"}) == "fake"
    assert named_launcher(["--launcher", "ssh", "t.py"], cli.params, {"DISTRUN_LAUNCHER": "fake"}) == "ssh"


def test_a_config_file_names_the_launcher_when_nothing_else_does(tmp_path: Path) -> None:
    config = tmp_path / "distrun.yaml"
    config.write_text("launcher: fake\n")
    assert named_launcher(["--config", str(config), "t.py"], cli.params, {}) == "fake"
    assert named_launcher(["t.py"], cli.params, {"DISTRUN_CONFIG": str(config)}) == "fake"
    assert named_launcher(["--launcher", "ssh", "--config", str(config), "t.py"], cli.params, {}) == "ssh"
    config.write_text("num-proc: 2\n")
    assert named_launcher(["--config", str(config), "t.py"], cli.params, {}) is None


def test_a_declaration_becomes_the_click_option_it_describes(tmp_path: Path) -> None:
    port = click_option(BackendOption("x-port", "Port.", int, minimum=1, maximum=9))
    assert port.opts == ["--x-port"] and isinstance(port.type, click.IntRange)
    flag = click_option(BackendOption("x-fast", type=bool))
    assert flag.is_flag and flag.default is False
    key = click_option(BackendOption("x-key", type=Path, short="-k", multiple=True, must_exist=True))
    assert key.opts == ["-k", "--x-key"] and key.multiple and isinstance(key.type, click.Path)
    choice = click_option(BackendOption("x-mode", choices=("a", "b")))
    assert isinstance(choice.type, click.Choice) and list(choice.type.choices) == ["a", "b"]


def _config(argv: list[str]) -> Request:
    request = _parse(argv)
    assert isinstance(request, Request)
    return request


@pytest.mark.usefixtures("fake")
def test_a_registered_backend_gets_its_options_and_its_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(fake_backend.HOSTS_VAR, "f1:2,f2:1")
    config = _config(["--launcher", "fake", "--fake-log", str(tmp_path / "log"), "true"]).config
    assert config.launcher == "fake"
    assert config.hosts == (
        Host("f1", 2, origin=config.hosts[0].origin),
        Host("f2", 1, origin=config.hosts[1].origin),
    )
    assert config.num_proc == 3
    assert config.backend_options["fake"] == fake_backend.FakeOptions(tmp_path / "log")
    assert ssh_options(config).connect_timeout == 10.0  # every table backend's options are there too


@pytest.mark.usefixtures("fake")
def test_hosts_given_win_over_a_backends_own_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fake_backend.HOSTS_VAR, "f1:2")
    config = _config(["--launcher", "fake", "-H", "g1:1", "true"]).config
    assert [h.name for h in config.hosts] == ["g1"]


def test_the_slurm_allocation_is_the_srun_backends_host_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    found = api.get("srun").find_hosts({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1"}, None)
    assert found is not None and [h.name for h in found.hosts] == ["n1"]
    default = _config(["true"]).config
    assert default.launcher == "srun" and default.num_proc == 4
    borrowed = _config(["--launcher", "ssh", "--dry-run", "true"]).config
    assert borrowed.launcher == "ssh" and [h.name for h in borrowed.hosts] == ["n1", "n2"]
    local = _config(["--launcher", "local", "true"]).config
    assert [h.name for h in local.hosts] == ["localhost"]


def test_a_backend_that_does_not_load_is_one_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(api.BACKENDS, "broken", "tests.no_such_module")
    with pytest.raises(UsageError, match=r"--launcher broken: cannot load its backend tests.no_such_module"):
        _parse(["--launcher", "broken", "true"])


def test_a_backend_option_clashing_with_distruns_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    clashing = fake_backend.FakeBackend()
    clashing.options = (BackendOption("ssh-port"),)
    monkeypatch.setitem(api.BACKENDS, "clash", "tests.fake_backend")
    monkeypatch.setitem(api._FOUND, ("clash", "tests.fake_backend"), clashing)
    with pytest.raises(UsageError, match=r"--launcher clash: its option --ssh-port is already an option"):
        _parse(["--launcher", "clash", "true"])
