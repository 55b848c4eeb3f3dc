from __future__ import annotations

from pathlib import Path

import pytest

from launcher.core.forward import (
    denied_family,
    dropped_here,
    forwarded,
    is_leftover,
    parse_env_file,
    travelling_env,
)
from launcher.errors import UsageError


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("HOSTNAME", "host"),
        ("HOME", "login"),
        ("USER", "login"),
        ("PWD", "shell"),
        ("OLDPWD", "shell"),
        ("SHLVL", "shell"),
        ("_", "shell"),
        ("BASH_FUNC_module%%", "shell"),
        ("TERM", "terminal"),
        ("TERM_PROGRAM", "terminal"),
        ("TMUX_PANE", "terminal"),
        ("DISPLAY", "terminal"),
        ("SSH_AUTH_SOCK", "session"),
        ("XDG_RUNTIME_DIR", "session"),
        ("TMPDIR", "scratch"),
        ("NCCL_SOCKET_IFNAME", "interface"),
        ("PATH", None),
        ("PYTHONPATH", None),
        ("HF_HOME", None),
        ("WANDB_API_KEY", None),
        ("NCCL_DEBUG", None),
        ("TERMINAL_ID", None),  # TERM_ is the prefix, not TERM
    ],
)
def test_deny_list_families(name: str, family: str | None) -> None:
    assert denied_family(name) == family


@pytest.mark.parametrize(
    ("name", "leftover"),
    [
        ("TORCHELASTIC_USE_AGENT_STORE", True),
        ("TORCHELASTIC_RUN_ID", True),
        ("DISTRUN_NUM_PROC", True),
        ("RANK", True),
        ("MASTER_ADDR", True),
        ("OMPI_COMM_WORLD_RANK", True),
        ("PMI_RANK", True),
        ("HOROVOD_RANK", True),
        ("HOROVOD_FUSION_THRESHOLD", False),  # a setting, not an identity
        ("NCCL_DEBUG", False),
    ],
)
def test_leftovers(name: str, leftover: bool) -> None:
    assert is_leftover(name) is leftover


SHELL = {
    "PATH": "/venv/bin:/usr/bin",
    "HOME": "/root",
    "HOSTNAME": "launcher",
    "FAIL_CODE": "5",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "RANK": "3",
    "NCCL_SOCKET_IFNAME": "lo",
    "BASH_FUNC_ml%%": "() { :; }",
    "HF_TOKEN": "hf_x",
}


def test_forwarded_keeps_the_job_settings_only() -> None:
    assert forwarded(SHELL) == {"PATH": "/venv/bin:/usr/bin", "FAIL_CODE": "5", "HF_TOKEN": "hf_x"}


def test_precedence_forwarded_then_env_file_then_x() -> None:
    env = travelling_env(
        SHELL,
        forward=True,
        env_file=(("FAIL_CODE", "6"), ("FROM_FILE", "1"), ("BOTH", "file")),
        exports=(("BOTH", "x"), ("TORCHELASTIC_USE_AGENT_STORE", "False")),
    )
    assert env["FAIL_CODE"] == "6"
    assert env["FROM_FILE"] == "1"
    assert env["BOTH"] == "x"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # the user's explicit word


def test_no_forward_env_sends_only_what_was_named() -> None:
    env = travelling_env(SHELL, forward=False, env_file=(("A", "1"),), exports=(("B", "2"),))
    assert env == {"A": "1", "B": "2"}


def test_dropped_here_removes_leftovers_but_not_explicit_names() -> None:
    assert dropped_here(SHELL, explicit=["RANK"]) == ("NCCL_SOCKET_IFNAME", "TORCHELASTIC_USE_AGENT_STORE")


def test_interface_names_stay_without_an_outer_launch() -> None:
    shell = {"NCCL_SOCKET_IFNAME": "ib0", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert dropped_here(shell) == ("TORCHELASTIC_USE_AGENT_STORE",)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.env"
    path.write_text(text)
    return path


def test_env_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# settings\n\nA=1\nexport B = two words\nC='quoted # not a comment'\n"
        'D="x"\nE=\nFROM_SHELL\nURL=a=b\n',
    )
    assert dict(parse_env_file(path, {"FROM_SHELL": "yes"})) == {
        "A": "1",
        "B": "two words",
        "C": "quoted # not a comment",
        "D": "x",
        "E": "",
        "FROM_SHELL": "yes",
        "URL": "a=b",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A=1\n1B=2\n", ":2: '1B' is not a valid environment variable name"),
        ("A=1\nRANK=2\n", ":2 RANK: distrun sets RANK for every rank"),
        ("A=1\n\nA=2\n", ":3: A is already set at line 1"),
        ("NOT_SET_ANYWHERE_42\n", ":1: NOT_SET_ANYWHERE_42 has no value and is not set here"),
        ("SECRET-TOKEN=hunter2\n", ":1: 'SECRET-TOKEN' is not a valid"),
    ],
)
def test_env_file_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as info:
        parse_env_file(path, {})
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)
    assert "hunter2" not in str(info.value)


def test_env_file_missing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read env file .*nope\.env: No such file"):
        parse_env_file(tmp_path / "nope.env", {})
