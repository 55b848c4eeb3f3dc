from __future__ import annotations

import json
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import __version__
from launcher.backends.ssh.options import ssh_options
from launcher.core.command import resolve_command
from launcher.core.config import LaunchConfig
from launcher.errors import HostError
from tests.support import REPO
from tests.unit.cli_support import no_distrun_env, run  # noqa: F401  (the autouse fixture applies here)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[LaunchConfig]]:
    """Stand in for launcher.job.launch so a non-dry run records its config and starts nothing."""
    configs: list[LaunchConfig] = []
    fake = types.ModuleType("launcher.job.launch")

    def launch(config: LaunchConfig) -> int:
        configs.append(config)
        return 7

    fake.launch = launch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "launcher.job.launch", fake)
    yield configs


def config_of(launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], *args: str) -> LaunchConfig:
    code, _, err = run(capsys, *args)
    assert (code, err) == (7, "")
    return launched[-1]


def test_help_lists_examples_and_env_vars(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "distrun -np 8 -H host1:4,host2:4 train.py" in out
    assert "distrun --hostfile hostfiles/cluster.txt python -m pkg.train --epochs 3" in out
    assert "distrun -np 4 examples/train.py" in out
    for name in (
        "DISTRUN_NUM_PROC",
        "DISTRUN_HOSTS",
        "DISTRUN_EXPORT",
        "DISTRUN_SSH_KEEPALIVE",
        "DISTRUN_CONFIG",
    ):
        assert name in out
    assert run(capsys, "-h")[1] == out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version")[:2] == (0, f"distrun {__version__}\n")


def test_defaults_run_one_local_process(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_of(launched, capsys, "python", "-c", "pass")
    assert config.command == ("python", "-c", "pass")
    assert [(h.name, h.slots) for h in config.hosts] == [("localhost", 1)]
    assert config.num_proc == 1
    assert (config.prefix, config.grace_period, config.timeout, config.color) == ("rank", 5.0, None, None)
    assert (
        ssh_options(config).connect_timeout,
        ssh_options(config).keepalive_interval,
        ssh_options(config).keepalive_count,
    ) == (
        10,
        2,
        5,
    )


def test_command_options_go_to_the_workers(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_of(launched, capsys, "-np", "2", "python", "-m", "pkg.train", "--epochs", "3", "-np", "9")
    assert config.command == ("python", "-m", "pkg.train", "--epochs", "3", "-np", "9")
    assert config.num_proc == 2
    assert config.hosts[0].slots == 2


def test_every_option_reaches_the_config(
    launched: list[LaunchConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = tmp_path / "id_test"
    key.write_text("k")
    monkeypatch.setenv("FROM_SHELL", "yes")
    config = config_of(
        launched,
        capsys,
        *("-np", "3", "-H", "a:2,bob@b:2", "--master-addr", "10.0.0.1", "--master-port", "29400"),
        *("-x", "A=1", "--export", "FROM_SHELL", "--prefix", "host", "--timestamp"),
        *("--output-dir", str(tmp_path / "new" / "logs"), "--ranks", "0,2", "--timeout", "1.5"),
        *("--grace-period", "0.5", "--no-color", "--python", "/opt/py", "--network-interface", "eth1"),
        *("--ssh-port", "2222", "-i", str(key), "--host-key-policy", "accept-new"),
        *("--ssh-connect-timeout", "3", "--ssh-keepalive", "1"),
        "train.py",
    )
    assert [(h.user, h.name, h.slots) for h in config.hosts] == [(None, "a", 2), ("bob", "b", 2)]
    assert config.num_proc == 3
    assert (config.master_addr, config.master_port) == ("10.0.0.1", 29400)
    assert config.exports == (("A", "1"), ("FROM_SHELL", "yes"))
    assert (config.prefix, config.timestamp, config.color) == ("host", True, False)
    assert config.output_dir == tmp_path / "new" / "logs"
    assert config.console_ranks == frozenset({0, 2})
    assert (config.timeout, config.grace_period) == (1.5, 0.5)
    assert (config.python, config.network_interface) == ("/opt/py", "eth1")
    assert ssh_options(config).port == 2222
    assert ssh_options(config).identity_files == (key,)
    assert ssh_options(config).host_key_policy == "accept-new"
    assert (ssh_options(config).connect_timeout, ssh_options(config).keepalive_interval) == (3.0, 1.0)
    assert config.command == ("train.py",)


def test_hostfile_without_np_uses_every_slot(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=3\n")
    assert config_of(launched, capsys, "--hostfile", str(hostfile), "x").num_proc == 5


def test_env_vars_are_options(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRUN_NUM_PROC", "3")
    monkeypatch.setenv("DISTRUN_HOSTS", "a:2,b:2")
    monkeypatch.setenv("DISTRUN_EXPORT", "A=1 B=2")
    monkeypatch.setenv("DISTRUN_TIMEOUT", "9")
    monkeypatch.setenv("DISTRUN_COLOR", "true")
    config = config_of(launched, capsys, "x")
    assert config.num_proc == 3
    assert [h.name for h in config.hosts] == ["a", "b"]
    assert config.exports == (("A", "1"), ("B", "2"))
    assert (config.timeout, config.color) == (9.0, True)
    # The command line still wins over the environment.
    assert config_of(launched, capsys, "-np", "4", "x").num_proc == 4


def test_precedence_cli_env_config_default(
    launched: list[LaunchConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config_file = tmp_path / "distrun.yaml"
    config_file.write_text("num-proc: 2\ngrace_period: 7\nexport: [A=1, B=2]\nhosts:\n  - a:2\n  - b:2\n")
    cfg = ("--config", str(config_file))
    assert config_of(launched, capsys, "x").num_proc == 1
    from_file = config_of(launched, capsys, *cfg, "x")
    assert (from_file.num_proc, from_file.grace_period) == (2, 7.0)
    assert from_file.exports == (("A", "1"), ("B", "2"))
    assert [h.name for h in from_file.hosts] == ["a", "b"]
    monkeypatch.setenv("DISTRUN_NUM_PROC", "3")
    assert config_of(launched, capsys, *cfg, "x").num_proc == 3
    assert config_of(launched, capsys, *cfg, "-np", "4", "x").num_proc == 4
    monkeypatch.setenv("DISTRUN_CONFIG", str(config_file))
    assert config_of(launched, capsys, "x").grace_period == 7.0


def test_cli_hostfile_beats_config_hosts(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text("hosts: a:2\n")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("z slots=1\n")
    config = config_of(launched, capsys, "--config", str(config_file), "--hostfile", str(hostfile), "x")
    assert [h.name for h in config.hosts] == ["z"]


def test_launch_errors_become_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("launcher.job.launch")

    def launch(config: LaunchConfig) -> int:
        raise HostError("node9: ssh: connection refused")

    fake.launch = launch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "launcher.job.launch", fake)
    assert run(capsys, "x") == (3, "", "distrun: error: node9: ssh: connection refused\n")


def test_interrupt_before_launch_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("launcher.job.launch")

    def launch(config: LaunchConfig) -> int:
        raise KeyboardInterrupt

    fake.launch = launch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "launcher.job.launch", fake)
    said = "distrun: error: interrupted by SIGINT before any rank started\n"
    assert run(capsys, "x") == (130, "", said)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-np", "2"), "missing command"),
        (("-H", "a", "--hostfile", "f", "x"), "use either -H/--hosts or --hostfile, not both"),
        (("--grace-period", "0", "x"), "--grace-period must be a positive number of seconds, got 0"),
        (("--timeout", "inf", "x"), "--timeout must be a positive number of seconds, got inf"),
        (("--ssh-keepalive", "-1", "x"), "--ssh-keepalive must be a positive number of seconds"),
        (("--master-addr", "", "x"), "--master-addr '': expected one word"),
        (("--network-interface", "eth 0", "x"), "expected one word"),
        (("--host-key-policy", "yolo", "x"), "'yolo' is not one of"),
        (("--ssh-port", "70000", "x"), "70000 is not in the range"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("distrun: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_output_dir_checks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    code, _, err = run(capsys, "--output-dir", str(afile / "sub"), "x")
    assert code == 2
    assert f"{afile} is a file, not a directory" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_proc: [\n", ":2: not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping of option names to values"),
        ("bogus: 1\n", "unknown option 'bogus'"),
        ("config: other.yaml\n", "unknown option 'config'"),
        ("num-proc: 2\nnum_proc: 3\n", "'num-proc' and 'num_proc' set the same option"),
        ("num-proc: lots\n", ":1: num-proc: 'lots' is not a valid integer"),
        ("timeout: [1, 2]\n", ":1: timeout takes a single value"),
    ],
)
def test_bad_config_file_names_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(text)
    code, _, err = run(capsys, "--config", str(config_file), "x")
    assert code == 2
    assert str(config_file) in err
    assert message in err
    assert err.count("\n") == 1


def test_empty_config_file_is_fine(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config_file = tmp_path / "empty.yaml"
    config_file.write_text("# nothing yet\n")
    assert config_of(launched, capsys, "--config", str(config_file), "x").num_proc == 1


def test_dry_run_prints_plan_and_redacted_env(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    args = (
        "--dry-run",
        "-np",
        "3",
        "-H",
        "h1:2,[fd00::2]:2",
        "-x",
        "HF_TOKEN",
        "-x",
        "LR=0.1",
        "train.py",
        "--x",
    )
    code, out, err = run(capsys, *args)
    assert (code, err) == (0, "")
    assert "hf_supersecret" not in out
    assert "HF_TOKEN='<redacted>'" in out
    assert "    LR=0.1" in out
    lines = out.splitlines()
    assert lines[0] == "dry run: 3 processes on 2 hosts; nothing is started"
    assert lines[1] == f"command: {sys.executable} train.py --x"
    headers = [line for line in lines if line.startswith("rank ")]
    assert headers == [
        "rank 0: host=h1 local_rank=0 node_rank=0",
        "rank 1: host=h1 local_rank=1 node_rank=0",
        "rank 2: host=fd00::2 local_rank=0 node_rank=1",
    ]
    assert "    MASTER_PORT=auto" in lines
    assert "    MASTER_ADDR=h1" in lines
    # h1 is remote: its own OMP_NUM_THREADS would win, so the default is marked as such.
    assert lines.count("    OMP_NUM_THREADS=1  # unless the host sets it") == 2
    tf_line = next(line for line in lines[lines.index(headers[2]) :] if "TF_CONFIG=" in line)
    tf = json.loads(tf_line.split("=", 1)[1].strip("'"))
    assert tf == {
        "cluster": {"worker": ["h1:auto", "h1:auto", "[fd00::2]:auto"]},
        "task": {"type": "worker", "index": 2},
    }


def test_dry_run_shows_given_port(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--dry-run", "--master-addr", "10.1.1.1", "--master-port", "29400", "x")[1]
    assert "    MASTER_PORT=29400" in out.splitlines()
    assert "    MASTER_ADDR=10.1.1.1" in out.splitlines()


@pytest.mark.parametrize(
    ("command", "resolved"),
    [
        (("train.py", "--lr", "1"), ("/py", "train.py", "--lr", "1")),
        (("examples/train.py",), ("/py", "examples/train.py")),
        (("python", "train.py"), ("python", "train.py")),
        (("bash", "-c", "x.py"), ("bash", "-c", "x.py")),
        (("train.pyc",), ("train.pyc",)),
    ],
)
def test_resolve_command(command: tuple[str, ...], resolved: tuple[str, ...]) -> None:
    assert resolve_command(command, "/py") == resolved


def test_resolve_empty_command() -> None:
    from launcher.errors import UsageError

    with pytest.raises(UsageError, match="missing command"):
        resolve_command((), "/py")


def test_config_paths_are_relative_to_the_file(
    launched: list[LaunchConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "hosts").write_text("a slots=2\n")
    (conf / "job.env").write_text("LR=0.1\n")
    (tmp_path / "id_test").write_text("k")
    (conf / "c.yaml").write_text(
        "hostfile: hosts\nenv-file: job.env\noutput-dir: logs\nssh-identity-file: ~/id_test\n"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    config = config_of(launched, capsys, "--config", str(conf / "c.yaml"), "x")
    assert [(h.name, h.slots) for h in config.hosts] == [("a", 2)]
    assert config.env_file == (("LR", "0.1"),)
    assert config.output_dir == conf / "logs"
    assert ssh_options(config).identity_files == (tmp_path / "id_test",)


def test_config_file_itself_may_start_with_tilde(
    launched: list[LaunchConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "c.yaml").write_text("num-proc: 2\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_of(launched, capsys, "--config", "~/c.yaml", "x").num_proc == 2


def test_x_on_the_command_line_adds_to_the_file_exports(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "c.yaml").write_text("export: [A=1, B=2]\n")
    config = config_of(launched, capsys, "--config", str(tmp_path / "c.yaml"), "-x", "B=3", "-x", "C=4", "x")
    assert config.exports == (("A", "1"), ("B", "3"), ("C", "4"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num-proc: 2.7\n", "c.yaml:1: num-proc: expected a whole number, got 2.7"),
        ("timeout: 5\nnum-proc: yes\n", "c.yaml:2: num-proc: expected a whole number, got yes"),
        ("timeout: 5\ntimeout: 6\n", "c.yaml:2: 'timeout' is already set at line 1"),
        ("timeout: 0\n", "c.yaml:1: timeout must be a positive number of seconds, got 0"),
        ("grace-period: -1\n", "c.yaml:1: grace-period must be a positive number of seconds"),
        ("hosts: [a:2, 'b:x']\n", "c.yaml:1: hosts entry 'b:x': slots must be a positive integer"),
        ("export: [RANK=1]\n", "c.yaml:1: export RANK: distrun sets RANK for every rank"),
        ("python: two words\n", "c.yaml:1: python 'two words': expected one word"),
        ("hostfile: missing.txt\n", "cannot read hostfile {dir}/missing.txt"),
        ("ssh-identity-file: id_none\n", "c.yaml:1: ssh-identity-file: File '{dir}/id_none' does not exist"),
    ],
)
def test_config_value_errors_name_file_line_and_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "c.yaml").write_text(text)
    code, out, err = run(capsys, "--config", str(tmp_path / "c.yaml"), "x")
    assert (code, out) == (2, "")
    assert message.replace("{dir}", str(tmp_path)) in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ("localhost:2,127.0.0.1:2", "-H 'localhost:2' and -H '127.0.0.1:2' are both this machine"),
        (f"{socket.gethostname()}:1,localhost:1", "are both this machine; list it once"),
        ("[::1]:1,localhost:1", "are both this machine"),
    ],
)
def test_this_machine_under_two_names_is_refused(
    capsys: pytest.CaptureFixture[str], hosts: str, message: str
) -> None:
    code, _, err = run(capsys, "--dry-run", "-H", hosts, "x")
    assert code == 2
    assert message in err


def test_another_user_on_this_machine_is_not_run_as_me(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nobody@localhost` goes through SSH as nobody: the dry run shows what a remote rank would get."""
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    code, out, _ = run(capsys, "--dry-run", "-H", "nobody@localhost:1", "x")
    assert code == 0
    assert "rank 0: host=nobody@localhost" in out
    assert "    TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # unless the host sets it" in out.splitlines()


def test_runs_here() -> None:
    from launcher.backends.locality import runs_here
    from launcher.core.hosts import Host

    assert runs_here(Host("localhost"), user="me")
    assert runs_here(Host("127.0.0.1", user="me"), user="me")
    assert not runs_here(Host("localhost", user="nobody"), user="me")
    assert not runs_here(Host("h1"), user="me")


def test_np_beyond_this_machine_needs_oversubscribe(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    code, _, err = run(capsys, "-np", "9", "x")
    assert code == 2
    assert "-np 9: this machine has 2 CPU cores" in err
    assert config_of(launched, capsys, "-np", "9", "--oversubscribe", "x").num_proc == 9
    assert config_of(launched, capsys, "-np", "3", "-H", "a:2", "--oversubscribe", "x").num_proc == 3


def test_dry_run_shows_the_forwarded_environment_redacted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAIL_CODE", "5")
    monkeypatch.setenv("HOSTNAME", "launcher-box")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GIT_URL", "https://me:hunter2@git.example/x")
    monkeypatch.setenv("MYCO_SIGNING", "s3cret")
    monkeypatch.setenv("GITHUB_PAT", "ghp_abc")
    (tmp_path / "job.env").write_text("FROM_FILE=1\nFAIL_CODE=6\n")
    args = ("--dry-run", "-H", "localhost:1,h1:1", "--env-file", str(tmp_path / "job.env"))
    code, out, _ = run(capsys, *args, "--redact", "myco_*", "-x", "FAIL_CODE=7", "x")
    assert code == 0
    for secret in ("hunter2", "s3cret", "ghp_abc"):
        assert secret not in out
    lines = out.splitlines()
    shared = lines[lines.index("every rank gets, from this shell (less the deny-list), --env-file, -x:") :]
    shared = shared[: next(i for i, line in enumerate(shared) if line.startswith("rank 0"))]
    assert "    FAIL_CODE=7" in shared
    assert "    FROM_FILE=1" in shared
    assert "    GIT_URL='https://me:<redacted>@git.example/x'" in shared
    assert "    MYCO_SIGNING='<redacted>'" in shared
    assert not any(line.startswith(("    HOSTNAME=", "    TORCHELASTIC_USE")) for line in shared)
    assert "removed from every rank (left by another launcher): TORCHELASTIC_USE_AGENT_STORE" in lines

    code, out, _ = run(capsys, *args, "--no-forward-env", "x")
    shared = out.split("every rank gets, from --env-file, -x:\n")[1].split("rank 0")[0]
    assert shared.splitlines()[:2] == ["    FAIL_CODE=6", "    FROM_FILE=1"]
    assert shared.splitlines()[2].startswith("removed from every rank")


def test_subcommands_are_the_first_word_only(capsys: pytest.CaptureFixture[str]) -> None:
    """`distrun -- ssh-setup` and `./ssh-setup` launch a command of that name (here in a dry run)."""
    code, out, _ = run(capsys, "--dry-run", "--", "ssh-setup", "-H", "x")
    assert code == 0
    assert "command: ssh-setup -H x" in out.splitlines()
    assert "command: ./ssh-setup" in run(capsys, "--dry-run", "./ssh-setup")[1]
    code, _, err = run(capsys, "ssh-setup")
    assert (code, err) == (2, "distrun: error: ssh-setup: which hosts? give -H or --hostfile\n")


def test_file_exports_errors_name_the_file_even_with_x_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "c.yaml").write_text("num-proc: 1\nexport: [RANK=1]\n")
    code, _, err = run(capsys, "--config", str(tmp_path / "c.yaml"), "-x", "A=1", "x")
    assert code == 2
    assert f"{tmp_path}/c.yaml:2: export RANK: distrun sets RANK" in err


SLURM_JOB = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NODELIST": "gpu[01-02],cpu-a1",
    "SLURM_TASKS_PER_NODE": "2(x2),1",
    "SLURM_NTASKS": "5",
}


@pytest.fixture
def in_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SLURM_JOB.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("in_slurm_job")
def test_inside_slurm_hosts_slots_and_np_come_from_the_job(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_of(launched, capsys, "train.py")
    assert [(h.name, h.slots) for h in config.hosts] == [("gpu01", 2), ("gpu02", 2), ("cpu-a1", 1)]
    assert (config.num_proc, config.launcher) == (5, "srun")
    assert config_of(launched, capsys, "-np", "3", "train.py").num_proc == 3
    assert config_of(launched, capsys, "--launcher", "ssh", "train.py").launcher == "ssh"


@pytest.mark.usefixtures("in_slurm_job")
def test_inside_slurm_explicit_hosts_win(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_of(launched, capsys, "-H", "a:2", "train.py")
    assert ([h.name for h in config.hosts], config.num_proc, config.launcher) == (["a"], 2, "ssh")
    config = config_of(launched, capsys, "--launcher", "srun", "-H", "gpu02:2", "train.py")
    assert ([h.name for h in config.hosts], config.launcher) == (["gpu02"], "srun")


@pytest.mark.usefixtures("in_slurm_job")
def test_launcher_local_ignores_the_allocation(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_of(launched, capsys, "--launcher", "local", "-np", "2", "train.py")
    assert ([(h.name, h.slots) for h in config.hosts], config.launcher) == ([("localhost", 2)], "local")


def test_outside_slurm_the_launcher_is_as_before(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node list without a job id is not an allocation (a stale variable in a login shell).
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    config = config_of(launched, capsys, "train.py")
    assert ([h.name for h in config.hosts], config.launcher) == (["localhost"], "ssh")
    monkeypatch.setenv("DISTRUN_LAUNCHER", "local")
    assert config_of(launched, capsys, "train.py").launcher == "local"


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        (
            {},
            ("--launcher", "srun", "x"),
            "--launcher srun needs a Slurm allocation (salloc, sbatch): SLURM_JOB_ID is not set",
        ),
        (
            SLURM_JOB,
            ("--launcher", "local", "-H", "a", "x"),
            "--launcher local runs every rank on this machine: drop -H/--hostfile",
        ),
        (
            {**SLURM_JOB, "SLURM_TASKS_PER_NODE": "2(x2"},
            ("x",),
            "SLURM_TASKS_PER_NODE='2(x2': bad count '2(x2' (expected N or N(xR))",
        ),
        (
            SLURM_JOB,
            ("-np", "6", "x"),
            "requested 6 processes but the hosts provide 5 slots; add --oversubscribe to place more ranks "
            "than slots",
        ),
    ],
)
def test_slurm_usage_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    args: tuple[str, ...],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(capsys, *args)
    assert (code, out, err) == (2, "", f"distrun: error: {message}\n")


@pytest.mark.usefixtures("in_slurm_job")
def test_dry_run_shows_the_slurm_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--dry-run", "x")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "dry run: 5 processes on 3 hosts; nothing is started"
    assert "launcher: srun" in lines
    assert [line for line in lines if line.startswith("rank ")] == [
        "rank 0: host=gpu01 local_rank=0 node_rank=0",
        "rank 1: host=gpu01 local_rank=1 node_rank=0",
        "rank 2: host=gpu02 local_rank=0 node_rank=1",
        "rank 3: host=gpu02 local_rank=1 node_rank=1",
        "rank 4: host=cpu-a1 local_rank=0 node_rank=2",
    ]
    assert "    MASTER_ADDR=gpu01" in lines


def test_distrun_variables_that_name_no_option_are_warned_about() -> None:
    from launcher.cli.main import cli, unknown_settings

    environ = {
        "DISTRUN_NUMPROC": "4",  # a typo of DISTRUN_NUM_PROC
        "DISTRUN_NUM_PROC": "2",
        "DISTRUN_WHATEVER": "x",
        "DISTRUN_RUN_ID": "abc",  # what distrun gives its ranks: a distrun started in a rank sees it
        "DISTRUN_OWN_GPUS": "1",
        "DISTRUN_CACHE_DIR": "/scratch/cache",  # no option, but read on every host (--workdir's cache)
        "OTHER": "y",
    }
    assert unknown_settings(environ, cli.params) == [
        "DISTRUN_NUMPROC names no option of distrun and is ignored (did you mean DISTRUN_NUM_PROC?)",
        "DISTRUN_WHATEVER names no option of distrun and is ignored",
    ]


def test_startup_timeout_is_an_option_a_variable_and_a_config_key(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    assert config_of(launched, capsys, "x").startup_timeout == 180.0
    assert config_of(launched, capsys, "--startup-timeout", "45", "x").startup_timeout == 45.0
    (tmp_path / "distrun.yaml").write_text("startup_timeout: 50\n")
    assert (
        config_of(launched, capsys, "--config", str(tmp_path / "distrun.yaml"), "x").startup_timeout == 50.0
    )
    monkeypatch.setenv("DISTRUN_STARTUP_TIMEOUT", "60")
    assert config_of(launched, capsys, "x").startup_timeout == 60.0
    code, _, err = run(capsys, "--startup-timeout", "0", "x")
    assert (code, err) == (
        2,
        "distrun: error: --startup-timeout must be a positive number of seconds, got 0\n",
    )


def test_preflight_and_check_perf_options(
    launched: list[LaunchConfig], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config_of(launched, capsys, "--preflight", "-np", "2", "true").preflight
    assert not config_of(launched, capsys, "-np", "2", "true").preflight
    asked: list[tuple[LaunchConfig, bool]] = []

    def run_check(config: LaunchConfig, perf: bool = False) -> int:
        asked.append((config, perf))
        return 0

    monkeypatch.setattr("launcher.check.run.run_check", run_check)
    assert run(capsys, "check", "--perf", "-H", "a,b", "--timeout", "50", "-x", "NCCL_DEBUG=INFO")[0] == 0
    assert run(capsys, "check", "-H", "a,b")[0] == 0
    assert [flag for _, flag in asked] == [True, False]
    perf, plain = (config for config, _ in asked)
    assert perf.timeout == 50.0 and ("NCCL_DEBUG", "INFO") in perf.exports
    assert not plain.preflight
    code, out, _ = run(capsys, "check", "--help")
    assert code == 0 and "--perf" in out and "--preflight" not in out
