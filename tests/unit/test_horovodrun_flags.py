"""Every flag of horovodrun's parser is accepted by distrun or explained, and the hidden ones do what
docs/usage.md says: aliases set their distrun option, tuning flags the engine honours set its HOROVOD_*
variable on every rank, the others say in one line what distrun does instead (and so does their HOROVOD_*
variable in the ranks' environment). Every horovodrun command line of Horovod's docs is a distrun command
line, read as horovodrun's argparse parser reads it (abbreviations included).

The flags are read from Horovod's own parser (horovod/runner/launch.py) and the command lines from its
README.rst and docs/*.rst where a checkout is at hand (HOROVOD_SRC), else from tests/data/horovodrun_flags.txt
and tests/data/horovodrun_commands.txt, derived from them.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import click
import pytest

from launcher.cli.horovodrun import FLAGS, PARSER_LONG_NAMES, Kind
from launcher.cli.main import _parse, _run, cli
from launcher.cli.request import Request

REPO = Path(__file__).resolve().parents[2]
# A Horovod checkout (HOROVOD_SRC) gives the flags of horovodrun's parser itself; else the list taken from it.
HOROVOD_SRC = Path(os.environ.get("HOROVOD_SRC", "/nonexistent"))
HOROVOD_LAUNCH = HOROVOD_SRC / "horovod" / "runner" / "launch.py"
# horovodrun's elastic flags: the elastic driver's own options (launcher's elastic work), not this table's.
ELASTIC = {"--slots-per-host", "--elastic-timeout", "--reset-limit", "--blacklist-cooldown-range"}


def horovodrun_flags() -> list[str]:
    if HOROVOD_LAUNCH.exists():
        source = HOROVOD_LAUNCH.read_text()
        return [
            name
            for call in re.finditer(r"add_argument\(((?:\s*'[^']*'\s*,)+)", source)
            for name in re.findall(r"'(-[^']+)'", call.group(1))
        ]
    lines = (REPO / "tests" / "data" / "horovodrun_flags.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _option_names() -> set[str]:
    return {name for p in cli.params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def test_every_horovodrun_flag_is_accepted_or_explained() -> None:
    flags = horovodrun_flags()
    assert len(flags) > 60
    names = _option_names()
    missing = [flag for flag in flags if flag not in names and flag not in ELASTIC]
    assert missing == []


def test_the_table_leaves_the_elastic_flags_to_the_elastic_driver() -> None:
    assert ELASTIC.isdisjoint(name for flag in FLAGS for name in flag.names)


def test_the_hidden_flags_collide_with_no_distrun_option() -> None:
    hidden = [name for flag in FLAGS for name in flag.names]
    visible = {name for p in cli.params if isinstance(p, click.Option) and not p.hidden for name in p.opts}
    assert len(hidden) == len(set(hidden))
    assert visible.isdisjoint(hidden)


def test_usage_md_maps_every_flag() -> None:
    usage = (REPO / "docs" / "usage.md").read_text()
    assert [flag for flag in horovodrun_flags() if f"`{flag}`" not in usage] == []


def test_aliases_and_tuning_flags_become_distrun_options_and_rank_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    request = _parse(
        [
            "-p", "2222", "--start-timeout", "77", "--output-filename", "out", "--log-level", "DEBUG",
            "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--no-stall-check",
            "--mpi-args", "--bind-to none", "--autotune", "-np", "2", "--dry-run", "true",
        ]
    )  # fmt: skip
    assert isinstance(request, Request)
    config = request.config
    assert config.startup_timeout == 77
    assert config.output_dir == Path("out")
    assert request.verbose == 1
    assert getattr(config.backend_options["ssh"], "port", None) == 2222
    exports = dict(config.exports)
    assert exports["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert exports["HOROVOD_CYCLE_TIME"] == "2.5"
    assert exports["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    err = capsys.readouterr().err
    assert "--mpi-args is not needed" in err and "--autotune (HOROVOD_AUTOTUNE) has no effect" in err


def test_every_kind_is_used() -> None:
    assert {flag.kind for flag in FLAGS} == set(Kind)


def test_the_abbreviations_are_read_against_horovodruns_long_options() -> None:
    assert set(PARSER_LONG_NAMES) == {
        "--help",
        *(flag for flag in horovodrun_flags() if flag.startswith("--")),
    }


def _docs_commands(root: Path) -> list[str]:
    """Each `horovodrun ...` command line of Horovod's README.rst and docs/*.rst (a line ending in a
    backslash continues), without the word horovodrun, in order, each once."""
    commands: list[str] = []
    for path in [root / "README.rst", *sorted((root / "docs").glob("*.rst"))]:
        lines = iter(path.read_text().splitlines())
        for line in lines:
            found = re.search(r"(?:^|\s)horovodrun(\s.*)$", line)
            if found is None or "``" in line:
                continue
            text = found.group(1)
            while text.rstrip().endswith("\\"):
                text = text.rstrip()[:-1] + " " + next(lines).strip()
            command = " ".join(text.split())
            if command not in commands:
                commands.append(command)
    return commands


def horovodrun_commands() -> list[str]:
    if (HOROVOD_SRC / "docs").is_dir():
        return _docs_commands(HOROVOD_SRC)
    lines = (REPO / "tests" / "data" / "horovodrun_commands.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.fixture
def horovod_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with the files Horovod's examples name: train.py, a hostfile, discovery scripts."""
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "myhostfile").write_text("host1 slots=4\nhost2 slots=4\n")
    for name in ("discover_hosts.sh", "discover_hosts.py"):
        script = tmp_path / name
        script.write_text("#!/bin/sh\necho host1:4\necho host2:4\necho host3:4\n")
        script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith(("HOROVOD_", "DISTRUN_"))]:
        monkeypatch.delenv(name)
    return tmp_path


def test_the_data_file_holds_every_command_line_of_horovods_docs() -> None:
    commands = horovodrun_commands()
    assert len(commands) >= 39
    if (HOROVOD_SRC / "docs").is_dir():
        lines = (REPO / "tests" / "data" / "horovodrun_commands.txt").read_text().splitlines()
        assert [line for line in lines if line and not line.startswith("#")] == commands


@pytest.mark.parametrize("command", horovodrun_commands())
def test_every_command_line_of_horovods_docs_is_accepted(
    command: str, horovod_example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = _parse(shlex.split(command))
    if command == "--check-build":
        assert request == 0
    else:
        assert isinstance(request, Request), capsys.readouterr().err
        assert request.config.command[-1] == shlex.split(command)[-1]


def test_a_discovery_script_without_min_np_is_elastic_from_np(horovod_example: Path) -> None:
    request = _parse(["-np", "8", "--host-discovery-script", "discover_hosts.sh", "python", "train.py"])
    assert isinstance(request, Request)
    assert (request.config.restart.min_np, request.config.num_proc) == (8, 8)


@pytest.mark.parametrize("spelled", ["--slots", "--slots-per", "--slots-per-host"])
def test_a_unique_prefix_of_a_horovodrun_option_is_that_option(spelled: str, horovod_example: Path) -> None:
    argv = ["-np", "8", "--host-discovery-script", "discover_hosts.sh", spelled, "2", "python", "train.py"]
    request = _parse(argv)
    assert isinstance(request, Request)
    assert request.config.restart.slots_per_host == 2
    equals = _parse([*argv[:4], f"{spelled}=2", *argv[6:]])
    assert isinstance(equals, Request) and equals.config.restart.slots_per_host == 2


def test_abbreviations_of_tuning_flags_and_of_options_with_two_values(horovod_example: Path) -> None:
    request = _parse(["-np", "2", "--fusion", "1", "--cycle", "3", "--blacklist", "5", "9",
                      "--min-np", "1", "python", "train.py"])  # fmt: skip
    assert isinstance(request, Request)
    exports = dict(request.config.exports)
    assert (exports["HOROVOD_FUSION_THRESHOLD"], exports["HOROVOD_CYCLE_TIME"]) == (str(1 << 20), "3")
    assert request.config.restart.cooldown_range == (5.0, 9.0)


def test_the_commands_own_options_are_never_expanded(horovod_example: Path) -> None:
    request = _parse(["-np", "2", "python", "train.py", "--slots", "4", "--fus"])
    assert isinstance(request, Request)
    assert request.config.command[-3:] == ("--slots", "4", "--fus")


def test_a_prefix_of_several_horovodrun_options_is_one_line_naming_them(
    horovod_example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["-np", "2", "--log", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "ambiguous option --log" in err and "--log-level" in err and "--log-hide-timestamp" in err


@pytest.mark.parametrize("extra", [[], ["-np", "2", "python", "train.py"]])
def test_check_build_prints_the_build_and_exits_0(
    extra: list[str], horovod_example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["--check-build", *extra]) == 0
    out = capsys.readouterr().out
    assert "[X] PyTorch" in out and "[ ] TensorFlow" in out and "[X] Gloo" in out and "[ ] MPI" in out
    assert "Available Tensor Operations:" in out


def _said(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    request = _parse([*argv, "--dry-run", "-np", "2", "python", "train.py"])
    assert isinstance(request, Request)
    return [line for line in capsys.readouterr().err.splitlines() if "horovodrun's" in line]


@pytest.mark.parametrize(
    ("flags", "variable"),
    [
        (["--timeline-filename", "/tmp/t.json"], "HOROVOD_TIMELINE=/tmp/t.json"),
        (["--autotune"], "HOROVOD_AUTOTUNE=1"),
        (["--no-autotune"], "HOROVOD_AUTOTUNE=0"),
        (["--hierarchical-allreduce"], "HOROVOD_HIERARCHICAL_ALLREDUCE=1"),
        (["--log-without-timestamp"], "HOROVOD_LOG_HIDE_TIME=1"),
        (["--thread-affinity", "1"], "HOROVOD_THREAD_AFFINITY=1"),
    ],
)
def test_a_horovod_variable_says_what_its_flag_says(
    flags: list[str],
    variable: str,
    horovod_example: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    by_flag = _said(flags, capsys)
    assert len(by_flag) == 1 and flags[0] in by_flag[0]
    assert _said(["-x", variable], capsys) == by_flag
    name, _, value = variable.partition("=")
    (horovod_example / "env").write_text(f"{variable}\n")
    assert _said(["--env-file", "env"], capsys) == by_flag
    monkeypatch.setenv(name, value)
    assert _said([], capsys) == by_flag
    assert _said(flags, capsys) == by_flag  # both ways at once: said once


def test_the_variables_the_engine_honours_say_nothing(
    horovod_example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    honoured = [
        "HOROVOD_FUSION_THRESHOLD=1",
        "HOROVOD_CYCLE_TIME=2",
        "HOROVOD_STALL_CHECK_DISABLE=1",
        "HOROVOD_CACHE_CAPACITY=16",
    ]
    assert _said([arg for name in honoured for arg in ("-x", name)], capsys) == []


@pytest.mark.parametrize(
    "flag",
    ["--log-with-timestamp", "--log-without-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp"],
)
def test_each_timestamp_flag_is_named_as_given(
    flag: str, horovod_example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = _said([flag], capsys)
    assert len(said) == 1 and f"horovodrun's {flag} " in said[0]
