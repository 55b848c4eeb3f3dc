"""tests/conftest.py's promises, checked from inside a test: no enclosing job's variables, and programs that a
test starts begin with the default disposition of every signal the tests send (the suite may run under
`nohup`, inside srun or mpirun)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import SENT_BY_TESTS, is_outer_job


def test_no_variable_of_an_enclosing_job_is_seen() -> None:
    assert sorted(filter(is_outer_job, os.environ)) == []


def test_the_check_knows_the_variables_other_launchers_leave() -> None:
    names = ["PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_JOB_ID", "SLURMD_NODENAME", "DISTRUN_RUN_ID", "RANK"]
    assert [name for name in names if not is_outer_job(name)] == []
    assert not is_outer_job("PATH") and not is_outer_job("CUDA_VISIBLE_DEVICES")


def test_a_started_program_ignores_none_of_the_signals_tests_send() -> None:
    code = (
        "import signal, sys\n"
        "print([s for s in map(int, sys.argv[1:]) if signal.getsignal(s) == signal.SIG_IGN])"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code, *map(str, map(int, SENT_BY_TESTS))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.stdout == "[]\n"
