"""What a real distrun says, one case per class of issue 27 item 16 (tables: tests/unit/test_messages.py):
a DISTRUN_* value's error, a distrun inside a rank, a command that cannot run, this machine's one name, -v
without class names, plurals, no "none" lists."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from launcher.agent.protocol import Facts
from launcher.core.result import HostLost, RankFailed, Signalled, Succeeded, TimedOut
from tests.multihost.support import Where
from tests.support import SCRIPTS, clean_env, run_distrun


def test_a_bad_distrun_variable_is_named_with_its_option() -> None:
    done = run_distrun("true", env=clean_env(DISTRUN_NUM_PROC="abc"))
    assert done.returncode == 2
    assert done.stderr.decode() == (
        "distrun: error: Invalid value for DISTRUN_NUM_PROC (-np/--num-proc): 'abc' is not a valid integer.\n"
    )


def test_a_distrun_inside_a_rank_warns_about_nothing_it_was_given(tmp_path: Path) -> None:
    """The inner distrun sees the contract and the stack hook's DISTRUN_* variables: no warning for any."""
    inner = f"{sys.executable} -m launcher --dry-run true >/dev/null"
    done = run_distrun("-np", "1", "sh", "-c", inner, env=clean_env())
    assert done.returncode == 0, done.stderr.decode()
    assert b"names no option" not in done.stdout + done.stderr, done.stdout.decode() + done.stderr.decode()


def test_a_directory_as_the_command_is_named_as_a_shell_would_and_as_localhost(
    tmp_path: Path, where: Where
) -> None:
    """On an SSH host, on the host as the summary names it: here by its address, which is not the machine's
    own hostname."""
    if where.cluster is None:
        host, hosts, command = "localhost", ("-np", "1"), tmp_path
    else:
        host = where.cluster.addr("h2")
        hosts, command = ("-H", f"{host}:1"), Path("/tmp")
    done = run_distrun(*hosts, command, env=where.env(pythonpath=False))
    err = done.stderr.decode()
    assert done.returncode == 126, err
    assert f"[0] distrun: cannot start rank 0 on {host}: {command}: is a directory\n" in err
    assert "Permission denied" not in err
    assert f"rank 0 (host {host}) exited with code 126" in err
    if where.ssh:
        assert "h2" not in err
        where.assert_clean(within=10)


def test_v_names_the_cause_in_words_and_counts_agree(tmp_path: Path) -> None:
    done = run_distrun("-vv", "-np", "1", "--timeout", "1", "sleep", "60")
    err = done.stderr.decode()
    assert done.returncode == 124, err
    # No record's repr (`Facts(hostname=...)`), no class name, no "(s)" plural.
    classes = (Facts, RankFailed, HostLost, Signalled, TimedOut, Succeeded)
    assert [c.__name__ for c in classes if c.__name__ in err] == [], err
    assert not re.search(r"\b[A-Z]\w+\(\w+=", err), err
    assert "(s)" not in err
    assert "distrun: probe: 1 agent answered" in err
    assert "distrun: host localhost: hostname " in err
    assert "distrun: started 1 rank on 1 host;" in err
    assert "distrun: stopping every rank: timed out after 1s\n" in err
    assert "TimedOut" not in err
    assert "distrun: timed out after 1s; ranks still running were stopped: 0\n" in err
    assert "none" not in err


def test_an_abort_at_exit_after_the_peers_is_named_torchs_teardown(tmp_path: Path, where: Where) -> None:
    """Every rank printed its result, the others exited 0, then the last one died of SIGABRT at interpreter
    exit: the summary names torch's teardown abort and its fix; the exit code stays the rank's (134)."""
    os.mkfifo(tmp_path / "fifo")
    hosts = where.either(("-np", "2"), ("-H", "h1:2"))
    script = SCRIPTS / "teardown_abort.py"
    done = run_distrun(*hosts, sys.executable, script, tmp_path / "fifo", env=where.env())
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 134, err
    assert "rank 0: accuracy 0.93" in out and "rank 1: accuracy 0.93" in out, out
    assert "rank 1 (host " in err and ") was killed by SIGABRT (exit code 134)" in err, err
    assert (
        "rank 1 aborted (SIGABRT) after every other rank had exited 0: most likely torch's abort at "
        "interpreter exit (`terminate called without an active exception`)"
    ) in err, err
    assert "call torch.distributed.destroy_process_group() at the end of the script" in err, err
    if where.ssh:
        where.assert_clean()


def test_a_rank_aborting_while_its_peers_still_run_is_no_teardown_abort(tmp_path: Path) -> None:
    """SIGABRT while another rank was still running (and was stopped): an abort like any other."""
    script = "import os; os.abort() if os.environ['RANK'] == '1' else __import__('time').sleep(60)"
    done = run_distrun("-np", "2", sys.executable, "-c", script)
    err = done.stderr.decode()
    assert done.returncode == 134, err
    assert "was killed by SIGABRT" in err and "destroy_process_group" not in err, err
