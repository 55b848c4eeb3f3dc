"""`--host-discovery-script` with real processes: a hanging script goes with everything it started, and
every way it can fail is one line (issue 19, defect 6)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.job.discovery import DiscoveryError, discover
from tests.support import assert_all_gone, recorded_pids, wait_for_files


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


# What a hanging script may have started: a child in the background, a grandchild through a subshell, a
# pipeline that holds its stdout, all in the script's process group.
HANGING = """
sleep 300 & echo $! > {d}/child.pid
( sleep 300 & echo $! > {d}/grandchild.pid; wait ) &
echo $$ > {d}/script.pid
sleep 300 | cat
"""


def test_a_hanging_script_is_stopped_with_its_whole_group(tmp_path: Path) -> None:
    script = _script(tmp_path, HANGING.format(d=tmp_path))
    started = time.monotonic()
    with pytest.raises(DiscoveryError) as caught:
        discover(script, timeout=1.0)
    assert time.monotonic() - started < 10, "the pipes it left did not hold distrun"
    message = str(caught.value)
    assert message == f"--host-discovery-script {script}: no answer within 1s; stopped it and what it started"
    wait_for_files(tmp_path, "*.pid", 3)
    assert_all_gone(recorded_pids(tmp_path))


def test_what_a_successful_script_leaves_running_is_stopped(tmp_path: Path) -> None:
    script = _script(tmp_path, f"sleep 300 >/dev/null 2>&1 & echo $! > {tmp_path}/child.pid\necho h1:2\n")
    hosts = discover(script, timeout=10.0)
    assert [(h.name, h.slots) for h in hosts] == [("h1", 2)]
    assert_all_gone(recorded_pids(tmp_path))


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("echo 'bad' >&2\nexit 4\n", "exited with code 4: bad"),
        ("echo 'h1:zero'\n", "output line 1 'h1:zero'"),
    ],
)
def test_failures_are_one_line(tmp_path: Path, body: str, said: str) -> None:
    with pytest.raises(DiscoveryError) as caught:
        discover(_script(tmp_path, body), timeout=10.0)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_script_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "noexec"
    path.write_text("#!/nonexistent/interpreter\n")
    path.chmod(0o755)
    with pytest.raises(DiscoveryError) as caught:
        discover(path, timeout=10.0)
    assert str(caught.value) == f"--host-discovery-script {path}: cannot run it: No such file or directory"


def test_slots_per_host_is_for_lines_without_slots(tmp_path: Path) -> None:
    script = _script(tmp_path, "echo h1\necho h2:3\necho '[::1]'\necho 'u@h4'\n")
    hosts = discover(script, timeout=10.0, slots_per_host=4)
    assert [(h.name, h.slots) for h in hosts] == [("h1", 4), ("h2", 3), ("::1", 4), ("h4", 4)]
    assert [h.slots for h in discover(script, timeout=10.0)] == [1, 3, 1, 1]
