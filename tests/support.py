"""Shared by the test packages: run the real `distrun` and see what it leaves behind."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from launcher.agent.protocol import Frame, FrameReader
from launcher.core.forward import is_leftover

T = TypeVar("T")
SCRIPTS = Path(__file__).parent / "integration" / "scripts"
REPO = Path(__file__).resolve().parents[1]
# A silent host (or a launcher not heard) is declared dead after 3 missed beats 0.5 s apart: 1.5 s.
FAST_DEATH = ("--ssh-keepalive", "0.5", "--ssh-keepalive-count", "3")
# A Slurm job's or step's variables: with them a launch without -H would become an srun launch.
SLURM_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_")
# The signals tests send to distrun and expect it (and its ranks) to act on.
SENT_BY_TESTS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM)


def is_outer_job(name: str) -> bool:
    """A variable that another launcher, Slurm or an enclosing distrun job leaves (see forward.py): what
    tests/conftest.py removes for the whole session."""
    return is_leftover(name) or name.startswith(SLURM_PREFIXES)


def require_machine(impossible: str | None, missing: str | None) -> None:
    """Skip where this machine can never run the test (not root, no namespaces); fail where a package is
    merely not installed: that is an install step (README names the packages, .ci/run installs them)."""
    if impossible is not None:
        pytest.skip(impossible)
    if missing is not None:
        pytest.fail(f"{missing}: install it (README, Quick start); not a skip, since this machine can run it")


def distrun_argv(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "launcher", *map(str, args)]


def gpu_env(**extra: str) -> dict[str, str]:
    """This environment without DISTRUN_* settings, the GPUs as this machine shows them (tests/gpu).

    A Slurm job the tests run in would turn every launch without -H into an srun launch: SLURM_* go too.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTRUN_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def clean_env(**extra: str) -> dict[str, str]:
    """`gpu_env` with the GPUs hidden: a CPU test's ranks run gloo on a machine with 0, 1 or 8 GPUs."""
    return gpu_env(**{"CUDA_VISIBLE_DEVICES": "", **extra})


def run_distrun(
    *args: str | os.PathLike[str],
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        distrun_argv(*args), capture_output=True, timeout=timeout, env=env or clean_env(), cwd=cwd or REPO
    )


def start_distrun(
    *args: str | os.PathLike[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        distrun_argv(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env or clean_env(),
        cwd=cwd or REPO,
    )


@contextlib.contextmanager
def never_left_running(
    proc: subprocess.Popen[bytes], grace: float = 60.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`proc`, a process the test started (a distrun, mostly), for the with-block. Still running after it
    (the test failed half-way, or is done with it): SIGTERM, so distrun stops its ranks as for a user, then
    SIGKILL if it has not ended within `grace` seconds; its pipes are drained meanwhile."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Files under `root` by relative path, with their text; directories made as needed."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def wait_until(
    condition: Callable[[], T], timeout: float = 30.0, what: str = "the condition", every: float = 0.05
) -> T:
    """`condition()`'s first truthy value, asked every `every` seconds; AssertionError naming `what` once
    `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)
    return value


def wait_for_files(directory: Path, pattern: str, count: int, timeout: float = 60) -> list[Path]:
    def found() -> list[Path]:
        files = sorted(directory.glob(pattern))
        return files if len(files) >= count else []

    return wait_until(found, timeout, f"{count} {pattern} files in {directory}")


class TooLate(AssertionError):
    """A try's job may have reached its --timeout before the test was done with it (see `Limit`)."""


@dataclass(frozen=True)
class Limit:
    """One try of a test whose job must get somewhere (ranks idle, a reset held) and be looked at there
    before its `--timeout` runs out: how soon it gets there depends on the machine's load. `started`: when
    the try began, before distrun did (so its own count, which starts later, has passed no more)."""

    seconds: int
    started: float = field(default_factory=time.monotonic)

    @property
    def option(self) -> tuple[str, str]:
        return ("--timeout", str(self.seconds))

    def ran_out(self) -> bool:
        return time.monotonic() - self.started >= self.seconds

    @contextlib.contextmanager
    def before_it(self, job: subprocess.Popen[bytes]) -> Iterator[None]:
        """The part of the try that must be done while `job` runs: ending with the job still running, or
        failing before `seconds` have passed (whatever the job did, its --timeout was not the cause), it is
        the test's verdict; failing later, or finding the job ended then, it is TooLate."""
        try:
            yield
        except Exception as failure:
            if self.ran_out():
                raise TooLate(f"--timeout {self.seconds} may have come first: {failure}") from failure
            raise
        if job.poll() is not None:
            said = f"the job ended (exit {job.returncode}) before the test was done with it"
            raise TooLate(said) if self.ran_out() else AssertionError(said)


def with_timeouts(attempt: Callable[[Limit], T], *seconds: int) -> T:
    """`attempt(Limit(s))` for each of `seconds` in turn, the next only where a try was TooLate: a short
    --timeout that a lightly loaded machine meets, then a generous one. `attempt` starts its job (under
    `limit.option`, with files of its own for this try) and holds what must come before the timeout in
    `limit.before_it(job)`; a failure there that the timeout may explain is tried again, never ignored:
    the last try's stands. Each try again is a warning in pytest's summary: a first --timeout to revisit
    where it comes often."""
    for limit in seconds[:-1]:
        try:
            return attempt(Limit(limit))
        except TooLate as late:
            warnings.warn(f"tried again with a longer --timeout: {late}", stacklevel=2)
    return attempt(Limit(seconds[-1]))


def sleeping_rank(ready: Path) -> tuple[Path, int, int]:
    """A job of scripts/stack_cases.py's `sleep` case, once its rank 0 has written its files into `ready`: the
    agent's dump directory, the rank's pid and its agent's (the rank's parent)."""
    wait_for_files(ready, "*.pid", 1)
    dump_dir = Path((ready / "0.dir").read_text())
    rank = int((ready / "0.pid").read_text())
    agent = int(Path(f"/proc/{rank}/stat").read_text().rpartition(")")[2].split()[1])
    return dump_dir, rank, agent


def attempt_envs(out: Path, attempt: int) -> dict[int, dict[str, str]]:
    """rank -> the environment its rank saw in that attempt (tests/integration/scripts/restartable.py)."""
    envs = (json.loads(path.read_text()) for path in out.glob(f"a{attempt}.r*.json"))
    return {int(env["RANK"]): env for env in envs}


def attempt_world(out: Path, attempt: int, *names: str) -> dict[int, tuple[str, ...]]:
    """rank -> (its host, WORLD_SIZE, then the values of `names`) as the ranks of that attempt saw them."""
    return {
        rank: (env["DISTRUN_HOSTNAME"], env["WORLD_SIZE"], *(env[name] for name in names))
        for rank, env in attempt_envs(out, attempt).items()
    }


def recorded_pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in directory.glob("*.pid") if p.read_text().strip()]


def alive(pids: Sequence[int]) -> list[int]:
    living = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def assert_all_gone(pids: Sequence[int], within: float = 5.0) -> None:
    assert pids, "the workers recorded no pids: the test would prove nothing"
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not alive(pids), within)
    assert alive(pids) == [], f"processes of the job still running: {alive(pids)}"


def start_shipped_agent(python: str = sys.executable, **env: str) -> subprocess.Popen[bytes]:
    """The agent as a remote host gets it: the bootstrap with -S from /, its modules' sources on stdin.

    Nothing of distrun is importable there, as on a host without it; the caller writes frames next. `python`:
    the host's interpreter; `env`: variables besides PATH in the agent's (the host's) environment.
    """
    from launcher.backends.bootstrap import bootstrap_args, shipped_sources

    sources = shipped_sources()
    proc = subprocess.Popen(
        [python, *bootstrap_args(sources)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env={"PATH": os.environ.get("PATH", ""), **env},
    )
    assert proc.stdin is not None
    for source in sources:
        proc.stdin.write(source)
    return proc


def read_terminal(fd: int) -> bytes:
    """Everything a child started with pty.fork() writes, until it closes the terminal (EIO on Linux)."""
    output = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return output
        if not chunk:
            return output
        output += chunk


def read_frames_until(proc: subprocess.Popen[bytes], reader: FrameReader, kind: int) -> list[Frame]:
    """An agent's frames (read from its stdout through `reader`) until one of `kind` has come."""
    assert proc.stdout is not None
    frames: list[Frame] = []
    while not any(f.kind == kind for f in frames):
        data = os.read(proc.stdout.fileno(), 65536)
        assert data, f"agent closed its output early; stderr: {proc.stderr.read() if proc.stderr else ''!r}"
        frames.extend(reader.feed(data))
    return frames


def read_until(proc: subprocess.Popen[bytes], needle: bytes, count: int, *, stderr: bool = False) -> bytes:
    """distrun's stdout (its stderr with `stderr`) until `needle` was seen `count` times: every byte read,
    maybe ending inside a line.

    Read from the pipe's fd, never through `proc.stdout`'s buffer: `communicate()` afterwards reads the fd
    itself, so bytes a buffered readline had read ahead would be lost to the caller."""
    pipe = proc.stderr if stderr else proc.stdout
    assert pipe is not None
    seen = b""
    while seen.count(needle) < count:
        chunk = os.read(pipe.fileno(), 65536)
        assert chunk, (
            f"distrun's {'stderr' if stderr else 'stdout'} ended before {count} x {needle!r}: {seen!r}"
        )
        seen += chunk
    return seen


def job_answer(pid: int, env: dict[str, str]) -> subprocess.CompletedProcess[str] | None:
    """What `distrun stacks PID` answers, or None while the job's control socket is not up yet (exit 1)."""
    done = subprocess.run(
        distrun_argv("stacks", str(pid)), capture_output=True, text=True, env=env, timeout=60
    )
    return done if done.returncode != 1 else None


HANG_VERDICT = (
    "verdict: 3 ranks wait in a collective (barrier); rank 2 is elsewhere: in stuck_in_loader, hang.py:14"
)


def ask_stacks_until(pid: int, expect: str, env: dict[str, str] | None = None, within: float = 60) -> str:
    """`distrun stacks PID` until its answer shows `expect` (the ranks may still be on their way there)."""
    deadline = time.monotonic() + within
    while True:
        done = subprocess.run(distrun_argv("stacks", str(pid)), capture_output=True, env=env or clean_env())
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()
        if expect in out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def assert_hang_grouped(text: str, rank2_host: str, barrier_hosts: str) -> None:
    """scripts/hang.py's stacks: rank 2's group first (the fewest ranks), then 0, 1, 3 in the barrier, each
    innermost frame last, then the verdict."""
    lines = text.splitlines()
    first = lines.index(f"rank 2 (1 of 4) on {rank2_host}:")
    second = lines.index(f"ranks 0-1,3 (3 of 4) on {barrier_hosts}:")
    assert first < second, text
    assert lines[second - 1].endswith(", in stuck_in_loader"), lines[first:second]
    barrier = [line for line in lines[second:] if line.strip().startswith("File")]
    assert barrier[-1].endswith(", in barrier"), barrier
    assert HANG_VERDICT in lines, text


def hang_stacks_then_timeout(
    job: subprocess.Popen[bytes],
    limit: Limit,
    ready_dir: Path,
    *,
    hosts: str,
    rank2_host: str,
    barrier_hosts: str,
    env: dict[str, str] | None = None,
) -> str:
    """scripts/hang.py under `limit.option`: `distrun stacks` while it runs shows the grouped stacks and the
    job goes on; at the timeout the same stacks come before the summary, exit 124. Returns distrun's stderr.

    `hosts`: "1 host" or "2 hosts"; `rank2_host`/`barrier_hosts`: the group headers' host lists."""
    with never_left_running(job):
        with limit.before_it(job):
            wait_for_files(ready_dir, "*.pid", 4, timeout=limit.seconds)
            shown = ask_stacks_until(job.pid, HANG_VERDICT, env)
            assert shown.startswith(f"stacks of 4 ranks on {hosts}:\n"), shown
            assert_hang_grouped(shown, rank2_host, barrier_hosts)
        _, err = job.communicate(timeout=limit.seconds + 60)
    text = err.decode()
    assert job.returncode == 124, text
    at_timeout = text[text.index(f"distrun: stacks of 4 ranks on {hosts} (timeout):") :]
    assert_hang_grouped(at_timeout, rank2_host, barrier_hosts)
    assert at_timeout.index(HANG_VERDICT) < at_timeout.index(f"distrun: timed out after {limit.seconds}s")
    return text


def open_terminal(cols: int = 80, rows: int = 24) -> tuple[int, int]:
    """A pseudo-terminal of `cols` x `rows`: its master and slave descriptors, the caller's to close."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, slave


class Terminal:
    """A pseudo-terminal of `cols` x `rows` whose output pyte renders as a terminal would show it.

    Write to `slave` (a descriptor) or `stream` (text on it); `raw` is every byte written so far, as read.
    """

    def __init__(self, cols: int = 60, rows: int = 10) -> None:
        import pyte  # only the terminal tests need it

        self.master, self.slave = open_terminal(cols, rows)
        os.set_blocking(self.master, False)
        self.stream = open(self.slave, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - see close()
        self.raw = b""
        self.screen = pyte.Screen(cols, rows)
        self._feed = pyte.ByteStream(self.screen)

    def lines(self) -> list[str]:
        """Every line of the screen, trailing blanks removed."""
        try:
            while chunk := os.read(self.master, 1 << 16):
                self.raw += chunk
                self._feed.feed(chunk)
        except BlockingIOError:
            pass
        return [line.rstrip() for line in self.screen.display]

    def shown(self) -> list[str]:
        """The lines with something on them."""
        return [line for line in self.lines() if line]

    def close(self) -> None:
        self.stream.close()
        os.close(self.master)
        os.close(self.slave)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now, chosen by the kernel: a random guess collided
    with ports in use once tests ran on several workers at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_two_ranks(script: Path, *args: str, port: int | None = None) -> list[subprocess.Popen[str]]:
    """Two ranks of `script` on this machine, a world of 2 rendezvousing on 127.0.0.1:`port` (a free one by
    default), without a launcher; their stdout is captured as text."""
    port = free_port() if port is None else port
    return [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(rank),
                "LOCAL_SIZE": "2",
            },
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
