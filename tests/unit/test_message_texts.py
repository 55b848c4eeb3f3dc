"""What distrun says when something is wrong reads as the user would put it (issue 27, item 16): a DISTRUN_*
value's error names the variable and its option, values show as written, plurals agree, this machine has one
name, no internal class name is shown. In-process tables; tests/integration/test_messages.py runs them."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

from launcher.agent.rank_process import exec_problem as _exec_problem
from launcher.agent.stackdump import DumpDir
from launcher.cli.main import cli, main, unknown_settings
from launcher.core.env import CONTRACT_NAMES
from launcher.core.hosts import parse_host_list
from launcher.core.restart import cause
from launcher.core.result import HostLost, RankExit, RankFailed, Signalled, Succeeded, TimedOut
from launcher.errors import UsageError
from launcher.report.summary import summarize
from tests.unit.cli_support import no_distrun_env  # noqa: F401  (the autouse fixture applies here)


def error_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    # Every case fails before anything could start.
    with pytest.raises(SystemExit) as info:
        main(list(args))
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DISTRUN_NUM_PROC": "abc"},
            "Invalid value for DISTRUN_NUM_PROC (-np/--num-proc): 'abc' is not a valid integer.",
        ),
        (
            {"DISTRUN_DRY_RUN": "maybe"},
            "Invalid value for DISTRUN_DRY_RUN (--dry-run): 'maybe' is not a valid boolean; "
            "expected true or false (also 1/0, yes/no, on/off)",
        ),
        ({"DISTRUN_PREFIX": "rnk"}, "Invalid value for DISTRUN_PREFIX (--prefix): 'rnk' is not one of"),
        ({"DISTRUN_TIMEOUT": "soon"}, "Invalid value for DISTRUN_TIMEOUT (--timeout): 'soon' is not a valid"),
        ({"DISTRUN_TIMEOUT": "0"}, "DISTRUN_TIMEOUT (--timeout) must be a positive number of seconds, got 0"),
        (
            {"DISTRUN_HOSTS": "a:x"},
            "DISTRUN_HOSTS (-H/--hosts) entry 'a:x': slots must be a positive integer",
        ),
        ({"DISTRUN_PYTHON": "two words"}, "DISTRUN_PYTHON (--python) 'two words': expected one word"),
        (
            {"DISTRUN_SSH_KEEPALIVE": "-2"},
            "DISTRUN_SSH_KEEPALIVE (--ssh-keepalive) must be a positive number",
        ),
    ],
)
def test_a_distrun_variables_error_names_the_variable_and_its_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = error_of(capsys, "true")
    assert message in err
    assert "Recognized values: ," not in err and "integer range" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-np", "abc"), "Invalid value for '-np' / '--num-proc': 'abc' is not a valid integer."),
        (("--timeout", "-1"), "--timeout must be a positive number of seconds, got -1"),
    ],
)
def test_the_command_line_names_its_option(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    assert message in error_of(capsys, *args, "true")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num-proc: true\n", "c.yaml:1: num-proc: expected a whole number, got true"),
        ("num-proc: yes\n", "c.yaml:1: num-proc: expected a whole number, got yes"),
        ("num-proc: 2.50\n", "c.yaml:1: num-proc: expected a whole number, got 2.50"),
        ("export: [A=1, 2.5]\n", "c.yaml:1: export"),
        ("dry-run: maybe\n", "c.yaml:1: dry-run: 'maybe' is not a valid boolean; expected true or false"),
        ("workdir-limit: [1, True]\n", "c.yaml:1: workdir-limit takes a single value"),
    ],
)
def test_a_config_value_shows_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "c.yaml").write_text(text)
    err = error_of(capsys, "--config", str(tmp_path / "c.yaml"), "true")
    assert message in err
    assert "True" not in err.replace("[1, True]", "")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("localhost:2:3", "more than one ':' (expected HOST or HOST:SLOTS)"),
        ("user@node1:4:1", "more than one ':' (expected HOST or HOST:SLOTS)"),
        ("fe80::1:4", "an IPv6 address must be written in brackets"),
        ("::1", "an IPv6 address must be written in brackets"),
        ("fe80::1%eth0:2", "an IPv6 address must be written in brackets"),
    ],
)
def test_the_ipv6_hint_is_given_only_for_an_address(entry: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_host_list(entry, "-H")
    assert message in str(caught.value)
    if "brackets" not in message:
        assert "IPv6" not in str(caught.value)


def test_no_variable_distrun_gives_a_rank_is_an_unknown_setting(tmp_path: Path) -> None:
    """A distrun started inside a rank sees the contract and the stack hook's variables: none is a stray."""
    dump_dir = DumpDir()
    try:
        given = {**dict.fromkeys(CONTRACT_NAMES, "x"), **dump_dir.rank_env({})}
    finally:
        dump_dir.remove()
    assert {"DISTRUN_STACK_DIR", "DISTRUN_STACK_SIGNAL"} <= set(given)
    assert unknown_settings(given, cli.params) == []


@pytest.mark.parametrize(
    ("errno_", "program", "message"),
    [
        (errno.EACCES, "{dir}", "{dir}: is a directory"),
        (errno.EACCES, "{dir}/plain.txt", "{dir}/plain.txt: Permission denied"),
        (errno.ENOENT, "no-such-program", "no-such-program: command not found"),
        (errno.ENOENT, "./no-such-file", "./no-such-file: No such file or directory"),
    ],
)
def test_a_command_that_cannot_run_is_named_as_a_shell_names_it(
    tmp_path: Path, errno_: int, program: str, message: str
) -> None:
    (tmp_path / "plain.txt").write_text("")
    program = program.replace("{dir}", str(tmp_path))
    exc = OSError(errno_, os.strerror(errno_), program)
    assert _exec_problem(exc, [program]) == message.replace("{dir}", str(tmp_path))


FAILED = RankExit(1, "localhost", 3)


@pytest.mark.parametrize(
    ("outcome", "words"),
    [
        (RankFailed(FAILED), "rank 1 (host localhost) exited with code 3"),
        (TimedOut(40.0), "timed out after 40s"),
        (Signalled(signal.SIGINT), "stopped by SIGINT"),
        (HostLost("h2", "no answer"), "lost host h2 (no answer)"),
        (Succeeded(), "succeeded"),
    ],
)
def test_every_outcome_has_words_and_no_class_name(outcome: object, words: str) -> None:
    text = cause(outcome)  # type: ignore[arg-type]
    assert text == words
    assert type(outcome).__name__ not in text


@pytest.mark.parametrize(
    ("outcome", "line"),
    [
        (TimedOut(5.0, ()), "timed out after 5s"),
        (TimedOut(5.0, (0, 1, 3)), "timed out after 5s; ranks still running were stopped: 0-1,3"),
        (Signalled(signal.SIGTERM, ()), "stopped by SIGTERM"),
        (Signalled(signal.SIGTERM, (2,)), "stopped by SIGTERM; ranks stopped: 2"),
        (RankFailed(FAILED, (0,)), "rank 1 (host localhost) exited with code 3; stopped rank 0"),
    ],
)
def test_the_summary_lists_no_none(outcome: object, line: str) -> None:
    lines = summarize(outcome, lambda rank: [])  # type: ignore[arg-type]
    assert lines == [line]
    assert "none" not in lines[0]


ABORTED = RankExit(1, "localhost", -signal.SIGABRT)
DONE_0, DONE_2 = RankExit(0, "localhost", 0), RankExit(2, "localhost", 0)


@pytest.mark.parametrize(
    ("outcome", "hinted"),
    [
        (RankFailed(ABORTED, peers_done=1), True),
        # Both exits read by one agent in one pass, the abort first: rank 0 still ended on its own with 0.
        (RankFailed(ABORTED, exited=(DONE_0,)), True),
        (RankFailed(ABORTED, exited=(DONE_0, DONE_2), peers_done=1), True),
        (RankFailed(ABORTED), False),  # alone: nothing says its work was done
        (RankFailed(ABORTED, (0,), peers_done=1), False),  # a peer was still running: stopped by distrun
        (RankFailed(ABORTED, exited=(RankExit(0, "localhost", 1),), peers_done=1), False),
        (RankFailed(RankExit(1, "localhost", 3), peers_done=1), False),
    ],
)
def test_an_abort_once_every_peer_exited_0_is_named_torchs_teardown(
    outcome: RankFailed, hinted: bool
) -> None:
    lines = summarize(outcome, lambda rank: [])
    assert any("most likely torch's abort at interpreter exit" in line for line in lines) == hinted, lines
