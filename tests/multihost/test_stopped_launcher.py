"""distrun itself stopped (SIGSTOP, not Ctrl-Z: it cannot tell the agents) and continued: it blames no host
for its own silence, and relays the output the ranks had sent meanwhile (issue 19, defect 4). Off a terminal
its agents give up on it after their patience; a terminal's job is waited for however long it is stopped,
Ctrl-Z or SIGSTOP alike, while its machine answers on the connection."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean
from tests.support import REPO, distrun_argv, read_until, start_distrun, wait_until

pytestmark = pytest.mark.multihost

# Numbered lines every 20 ms until stopped.
COUNTER = """
import itertools, time
for i in itertools.count():
    print(f"line {i}", flush=True)
    time.sleep(0.02)
"""


def _numbers(out: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"\] line (\d+)\n", out)]


def _stop_for(proc: subprocess.Popen[bytes], seconds: float) -> None:
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(seconds)  # the point: distrun does not run for this long
    os.kill(proc.pid, signal.SIGCONT)


def test_stopped_longer_than_the_agents_wait_blames_no_host(cluster: Cluster, tmp_path: Path) -> None:
    """--ssh-keepalive 1: agents wait 5 s for distrun, which is stopped for 8 s; they stop their ranks."""
    env = cluster.env(PYTHONPATH=str(REPO))
    proc = start_distrun("-H", "h1:1", "--ssh-keepalive", "1", "python", "-c", COUNTER, env=env)
    before = read_until(proc, b"line 10\n", 1)
    _stop_for(proc, 8.0)
    out, err = proc.communicate(timeout=60)
    said = err.decode()
    numbers = _numbers(before + out)
    assert proc.returncode == 3, said
    assert "lost host" not in said, said
    assert "host h1 stopped its ranks: distrun itself did not run for" in said, said
    assert numbers == list(range(len(numbers))), "a line was lost or repeated"
    # The rank went on writing for the 5 s the agent waited (250 lines on an idle machine): that output got
    # to the console, not only what distrun had read before it was stopped.
    assert numbers[-1] >= 10 + 30, f"only {numbers[-1]} lines: what the rank wrote while distrun was stopped"
    assert cluster.wait_clean(timeout=10.0) == {}


def test_stopped_shorter_than_the_agents_wait_goes_on(cluster: Cluster, tmp_path: Path) -> None:
    env = cluster.env(PYTHONPATH=str(REPO))
    script = COUNTER.replace("itertools.count()", "range(400)")
    proc = start_distrun("-H", "h1:1,h2:1", "--ssh-keepalive", "2", "python", "-c", script, env=env)
    before = read_until(proc, b"line 10\n", 2)
    _stop_for(proc, 4.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    for rank in (0, 1):
        lines = re.findall(rb"\[%d\] line (\d+)\n" % rank, before + out)
        assert [int(n) for n in lines] == list(range(400)), f"rank {rank}"


class OnTerminal:
    """distrun as a terminal's job: the session leader of a fresh pseudo-terminal (its foreground job, which
    Ctrl-Z on it stops), whose output a thread reads all along, as a terminal does."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        argv = distrun_argv(*args)
        self.pid, self.master = pty.fork()
        if self.pid == 0:  # pragma: no cover - the child execs at once
            os.chdir(REPO)
            os.execve(sys.executable, argv, env)
        self.output = b""
        self.code: int | None = None  # once it ended
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process of the terminal has closed it
                chunk = b""
            with self._changed:
                self.output += chunk
                self._changed.notify_all()
            if not chunk:
                return

    def wait_for(self, needle: bytes, timeout: float = 60.0) -> None:
        with self._changed:
            seen = self._changed.wait_for(lambda: needle in self.output, timeout)
        assert seen, f"never saw {needle!r}: {self.output.decode(errors='replace')}"

    def stopped(self) -> bool:
        return psutil.Process(self.pid).status() == psutil.STATUS_STOPPED

    def wait(self, timeout: float = 120.0) -> int:
        """distrun's exit code, once it ended and the terminal's last output was read."""

        def ended() -> tuple[int] | None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            return (status,) if pid else None

        (status,) = wait_until(ended, timeout, "distrun to end")
        self._reader.join(timeout)
        self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def text(self) -> str:
        return self.output.decode(errors="replace")


@contextmanager
def on_terminal(cluster: Cluster, *args: str) -> Iterator[OnTerminal]:
    # Without colours, its lines are as plain as off a terminal.
    job = OnTerminal(list(args), cluster.env(PYTHONPATH=str(REPO), NO_COLOR="1"))
    try:
        yield job
    finally:
        if job.code is None:  # the test failed half-way: stop it as a user would
            os.kill(job.pid, signal.SIGCONT)
            os.kill(job.pid, signal.SIGTERM)
            job.wait()
        os.close(job.master)


# Numbered lines every 0.1 s for 50 s.
SLOW_COUNTER = COUNTER.replace("itertools.count()", "range(500)").replace("0.02", "0.1")
# Numbered lines every 0.1 s until the file named by its argument exists, then 20 more and their count.
COUNTER_UNTIL = """
import itertools, os, sys, time
end = None
for i in itertools.count():
    if end is None and os.path.exists(sys.argv[1]):
        end = i + 20
    if i == end:
        break
    print(f"line {i}", flush=True)
    time.sleep(0.1)
print(f"lines {end}", flush=True)
"""
# --ssh-keepalive 1: the agents wait 7.5 s for a silent distrun (1 s x 5, plus 2.5 s); a stop 3 times that.
KEEPALIVE = ("--ssh-keepalive", "1")
LONG_STOP = 22.5


@pytest.mark.parametrize("how", ["ctrl-z", "sigstop"])
def test_a_terminal_job_stopped_thrice_its_agents_wait_goes_on_and_loses_no_host(
    cluster: Cluster, how: str, tmp_path: Path
) -> None:
    """Ctrl-Z (the agents are told) or kill -STOP (they are not) of distrun on a terminal, for three times the
    7.5 s its agents wait for a silent distrun (--ssh-keepalive 1): `fg` (SIGCONT) and the job goes on to
    exit 0, every line arrives once, and no host is counted lost or said to have stopped its ranks. Rank 0
    runs on this machine (a local agent), ranks 1 and 2 on SSH hosts; they end 20 lines after the test is
    done with them."""
    hosts = "localhost:1,h1:1,h2:1"
    done = tmp_path / "done"
    with on_terminal(
        cluster, "-H", hosts, "--ssh-keepalive", "1", "python", "-c", COUNTER_UNTIL, str(done)
    ) as job:
        job.wait_for(b"[2] line 10\r\n")
        if how == "ctrl-z":
            os.write(job.master, b"\x1a")  # the terminal sends SIGTSTP to its foreground job
        else:
            os.kill(job.pid, signal.SIGSTOP)
        wait_until(job.stopped, 30, "distrun to stop")
        time.sleep(LONG_STOP)  # the scenario: distrun does not run for this long
        assert job.stopped(), "distrun went on by itself"
        os.killpg(job.pid, signal.SIGCONT)  # what `fg` does
        done.touch()
        code = job.wait()
    said = job.text()
    assert code == 0, said
    assert "lost host" not in said and "stopped its ranks" not in said, said
    for rank in (0, 1, 2):
        lines = re.findall(rf"\[{rank}\] line (\d+)\r\n", said)
        count = re.findall(rf"\[{rank}\] lines (\d+)\r\n", said)
        assert len(count) == 1 and int(count[0]) > 20, f"rank {rank}: {said}"
        assert [int(n) for n in lines] == list(range(int(count[0]))), f"rank {rank}: {said}"
    assert_clean(cluster)


def test_a_stopped_terminal_job_cut_off_from_a_host_has_that_host_stop_its_ranks(
    make_cluster: Callable[..., Cluster],
) -> None:
    """The agents wait for a stopped distrun only while its machine answers: h2, cut off from it during a
    Ctrl-Z, stops its ranks after its patience (--ssh-keepalive 1: 7.5 s) while distrun is still stopped, and
    says so once the network is back; h1 keeps its ranks for the user's `fg`."""
    lab = make_cluster(2)
    with on_terminal(lab, "-H", "h1:1,h2:1", "--ssh-keepalive", "1", "python", "-c", SLOW_COUNTER) as job:
        job.wait_for(b"[1] line 10\r\n")
        os.write(job.master, b"\x1a")
        wait_until(job.stopped, 30, "distrun to stop")
        lab.link_down("h2")
        try:
            wait_until(lambda: len(lab.processes("h2")) == 1, 60, "h2 to stop its ranks (only its sshd left)")
            assert len(lab.processes("h1")) > 1, "h1 gave up on a distrun that only was stopped"
            assert job.stopped()
        finally:
            lab.link_up("h2")
        os.killpg(job.pid, signal.SIGCONT)
        code = job.wait()
    said = job.text()
    assert code != 0, said
    assert "lost host h2 (distrun agent: gave up on distrun after " in said, said
    assert "nor an acknowledgement from its machine for 7.5s" in said, said
    assert "lost host h1" not in said, said
    assert_clean(lab, within=30)
