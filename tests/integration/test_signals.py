"""Signals sent to distrun reach every rank as the README's table says; distrun ends as it says."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support import (
    SCRIPTS,
    assert_all_gone,
    read_until,
    recorded_pids,
    start_distrun,
    wait_for_files,
    wait_until,
)


def _start(pid_dir: Path, *script_args: str, ranks: int = 2) -> subprocess.Popen[bytes]:
    proc = start_distrun("-np", str(ranks), SCRIPTS / "signals.py", pid_dir, *script_args)
    wait_for_files(pid_dir, "rank*.pid", ranks)  # written once the rank's handlers are in place
    return proc


def _wait_for_status(pids: list[int], wanted: bool, timeout: float = 30.0) -> None:
    """Until every process is stopped (wanted=True) or none is (False)."""
    wait_until(
        lambda: all((psutil.Process(pid).status() == psutil.STATUS_STOPPED) == wanted for pid in pids),
        timeout,
        f"{pids} {'stopped' if wanted else 'running'}",
    )


def test_ctrl_c_reaches_every_rank_as_sigint_first(pid_dir: Path) -> None:
    proc = _start(pid_dir)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert out.count(b"cleaning up after KeyboardInterrupt") == 2, out.decode()
    assert err.decode().count("Ctrl-C again to kill every rank at once") == 1
    assert_all_gone(recorded_pids(pid_dir))


def test_a_rank_deaf_to_ctrl_c_gets_sigterm_halfway_through_the_grace_period(pid_dir: Path) -> None:
    proc = start_distrun("-np", "2", "--grace-period", "2", SCRIPTS / "signals.py", pid_dir, "--ignore-int")
    wait_for_files(pid_dir, "rank*.pid", 2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert out.count(b"got SIGTERM") == 2 and b"KeyboardInterrupt" not in out
    assert_all_gone(recorded_pids(pid_dir))


def test_sigterm_reaches_every_rank_as_sigterm(pid_dir: Path) -> None:
    proc = _start(pid_dir)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()
    assert out.count(b"got SIGTERM") == 2 and b"KeyboardInterrupt" not in out
    assert_all_gone(recorded_pids(pid_dir))


def test_sigusr1_and_sigusr2_are_forwarded_and_the_job_goes_on(pid_dir: Path) -> None:
    proc = _start(pid_dir, "--exit-on-usr1")
    read_until(proc, b"ready", 2)
    proc.send_signal(signal.SIGUSR2)
    read_until(proc, b"got SIGUSR2", 2)
    assert proc.poll() is None, "SIGUSR2 must not stop the job"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    # Each rank handles SIGUSR1 by exiting 0 (a checkpoint-and-leave convention): the job succeeds.
    assert proc.returncode == 0, err.decode()
    assert out.count(b"got SIGUSR1") == 2


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGHUP, 129), (signal.SIGQUIT, 131)])
def test_sighup_and_sigquit_stop_the_job_in_order(pid_dir: Path, sig: signal.Signals, code: int) -> None:
    proc = _start(pid_dir)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err.decode()
    assert f"stopped by {sig.name}" in err.decode()
    assert_all_gone(recorded_pids(pid_dir))


def test_ctrl_z_stops_every_rank_and_sigcont_resumes_them(pid_dir: Path) -> None:
    proc = _start(pid_dir)
    ranks = recorded_pids(pid_dir)
    proc.send_signal(signal.SIGTSTP)  # what the terminal sends on Ctrl-Z
    _wait_for_status([proc.pid, *ranks], wanted=True)
    proc.send_signal(signal.SIGCONT)  # what `fg` sends
    _wait_for_status([proc.pid, *ranks], wanted=False)
    proc.send_signal(signal.SIGUSR2)
    read_until(proc, b"got SIGUSR2", 2)  # the job is really running again
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()
    assert_all_gone(ranks)
