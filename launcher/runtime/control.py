"""The control channel of a running job: a Unix socket in a private per-user directory.

`distrun stacks` and `distrun top` connect to it from another terminal. Only the same user can: the
directory is the user's own with mode 0700 (checked, never trusted), the socket's mode is 0600, and the job
checks the peer's uid (SO_PEERCRED) on every connection. No TCP port is opened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import DistrunError

log = logging.getLogger(__name__)

REQUEST_STACKS = b"stacks\n"
# `distrun top`: the job answers at once, in every phase, with one JSON object (launcher.diagnose.live).
REQUEST_TOP = b"top\n"
REQUESTS = (REQUEST_STACKS, REQUEST_TOP)
# How a job that runs no rank now (starting, syncing its workdir, restarting) starts its answer: what follows
# is what it is doing, not stacks.
BUSY = "distrun-busy "
# Busy for a moment while its ranks run (a host joining a running job is reached and probed on the job's
# loop): `distrun stacks` asks again within its --wait rather than give up.
BRIEFLY = "distrun-busy-briefly "
AGAIN_S = 0.25
# A client that connected must say what it wants at once: the job's loop waits for it at most this long.
REQUEST_WAIT = 1.0
# Writing the answer to a client that does not read must not hold the job either.
ANSWER_WAIT = 5.0


class ControlError(DistrunError):
    """The runtime directory cannot be made safely, or no job answers (exit 1: nothing to show)."""

    exit_code = 1


class NoJob(ControlError):
    """No running job of this user (by that pid)."""


class JobBusy(ControlError):
    """The job runs no rank now (starting, syncing its workdir, between attempts): no stacks to show yet."""

    exit_code = 75  # EX_TEMPFAIL (sysexits.h): a temporary state, worth asking again


class NoAnswer(ControlError):
    """The job did not answer within --wait (a job that is hung itself)."""

    exit_code = 124


class SeveralJobs(ControlError):
    """Several jobs run and none was named: the user must choose (exit 2, as for bad input)."""

    exit_code = 2


def _usable_base(base: str | None, uid: int) -> bool:
    """Whether `$XDG_RUNTIME_DIR` is this user's to write in. `su` and `sudo -u` keep the first user's, which
    the second cannot write to (nor should use): then the per-uid directory in /tmp is the one."""
    if not base:
        return False
    try:
        info = os.stat(base)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid and os.access(base, os.W_OK | os.X_OK)


def chosen_dir() -> Path:
    """The directory for this user's sockets, whether or not it exists yet (the job and `distrun stacks`
    choose alike from the same environment)."""
    uid = os.getuid()
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "distrun" if base and _usable_base(base, uid) else Path(f"/tmp/distrun-{uid}")


def _private(path: Path, uid: int) -> Path:
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        raise ControlError(f"{path} is not a private directory of this user (mode 0700); remove it")
    return path


def runtime_dir() -> Path:
    """`$XDG_RUNTIME_DIR/distrun` where that directory is this user's, else `/tmp/distrun-UID`: made 0700 if
    missing, refused unless ours and private (another user could otherwise read what it holds or put a
    socket of theirs there)."""
    path = chosen_dir()
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise ControlError(f"cannot make {path}: {err.strerror or err}") from None
    return _private(path, os.getuid())


def _existing_dir() -> Path | None:
    """The chosen directory, checked to be private, where it exists (`distrun stacks` makes nothing)."""
    path = chosen_dir()
    return _private(path, os.getuid()) if os.path.lexists(path) else None


def _started_at(pid: int) -> float | None:
    """When process `pid` of this user started (seconds since the epoch), None when there is none."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    # Field 22 of stat, the start time in clock ticks after boot; `fields` begins at field 3.
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def is_stale(path: Path) -> bool:
    """Whether socket `path` (named by its job's pid) outlived its job: no such process of ours, or one that
    started after the socket was made (a reused pid). A distrun killed with SIGKILL leaves its socket."""
    try:
        made = path.lstat().st_mtime
    except OSError:
        return False
    started = _started_at(int(path.stem))
    # btime has whole seconds: a process that started in the same second as its socket is its owner.
    return started is None or started > made + 1.0


def remove_stale(directory: Path) -> None:
    for path in directory.glob("*.sock"):
        if path.stem.isdigit() and is_stale(path):
            with contextlib.suppress(OSError):
                path.unlink()


def socket_path(pid: int) -> Path:
    return chosen_dir() / f"{pid}.sock"


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class ControlServer:
    """The job's end: accept a connection, read its request; the caller answers when it can."""

    def __init__(self) -> None:
        directory = runtime_dir()
        # Sockets of jobs killed with SIGKILL (ours too, from a pid's earlier life) go at the next start.
        remove_stale(directory)
        self.path = directory / f"{os.getpid()}.sock"
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(8)
        self.sock.setblocking(False)
        # What answers `distrun top` (the job's live view, given what the job is doing); None: only that.
        self.top: Callable[[str], str] | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> socket.socket | None:
        """A connection that asked for stacks, or None (nothing waiting, another user, another request)."""
        accepted = self.accept_request()
        if accepted is None:
            return None
        conn, request = accepted
        if request != REQUEST_STACKS:
            conn.close()
            return None
        return conn

    def accept_request(self) -> tuple[socket.socket, bytes] | None:
        """A connection and its request (REQUESTS), or None (nothing waiting, another user, a bad request)."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        try:
            conn.settimeout(REQUEST_WAIT)
            if _peer_uid(conn) != os.getuid():
                raise OSError("another user")
            request = conn.recv(64)
            if request not in REQUESTS:
                raise OSError("not a request distrun knows")
            conn.settimeout(ANSWER_WAIT)
            return conn, request
        except OSError as err:
            log.debug("control socket: refused a connection: %s", err)
            conn.close()
            return None

    def answer_top(self, conn: socket.socket, doing: str) -> None:
        """`distrun top`: the live view where the job has one, else only what it is doing."""
        if self.top is not None:
            answer(conn, self.top(doing))
        else:
            answer(conn, json.dumps({"pid": os.getpid(), "doing": doing, "ranks": []}) + "\n")

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


@contextlib.contextmanager
def answering(server: ControlServer | None, doing: str, *, briefly: bool = False) -> Iterator[None]:
    """While the job's loop cannot run (the connections open before it: SSH handshakes on threads), a thread
    answers `distrun stacks` with what the job is doing, so that nobody waits for the handshakes."""
    if server is None:
        yield
        return
    stop_r, stop_w = os.pipe()

    def serve() -> None:
        while True:
            readable, _, _ = select.select([server.sock.fileno(), stop_r], [], [])
            if stop_r in readable:
                return
            accepted = server.accept_request()
            if accepted is None:
                continue
            conn, request = accepted
            if request == REQUEST_TOP:
                server.answer_top(conn, doing)
            else:
                answer_busy(conn, doing, briefly=briefly)

    thread = threading.Thread(target=serve, name="control", daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.write(stop_w, b"x")
        thread.join()
        os.close(stop_r)
        os.close(stop_w)


def answer_busy(conn: socket.socket, doing: str, *, briefly: bool = False) -> None:
    """Tell `distrun stacks` what the job is doing instead of running ranks (`restarting in 3s`); `briefly`:
    its ranks run, and the loop that gathers their stacks is busy for a moment."""
    answer(conn, f"{BRIEFLY if briefly else BUSY}{doing}\n")


def answer(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(text.encode())
    except OSError as err:
        log.debug("control socket: could not answer: %s", err)
    finally:
        conn.close()


@dataclass(frozen=True)
class RunningJob:
    """A running distrun found by its control socket."""

    pid: int
    command: str


def _command(pid: int) -> str | None:
    """The command line of a live process of ours, None if there is none by that pid."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def running_jobs() -> list[RunningJob]:
    """The user's distrun jobs with a live control socket, oldest pid first; stale sockets are removed."""
    directory = _existing_dir()
    if directory is None:
        return []
    remove_stale(directory)
    jobs = []
    for path in directory.glob("*.sock"):
        command = _command(int(path.stem)) if path.stem.isdigit() else None
        if command is not None:
            jobs.append(RunningJob(int(path.stem), command))
    return sorted(jobs, key=lambda j: j.pid)


def find_job(pid: int | None, command: str = "stacks") -> int:
    """`pid`, or the user's one running job: NoJob when none runs, SeveralJobs when several do."""
    if pid is not None:
        return pid
    jobs = running_jobs()
    if not jobs:
        raise NoJob("no running distrun job of yours")
    if len(jobs) > 1:
        listed = "; ".join(f"{j.pid}: {j.command}" for j in jobs)
        raise SeveralJobs(f"{len(jobs)} distrun jobs are running; name one: distrun {command} PID ({listed})")
    return jobs[0].pid


def ask(pid: int, request: bytes, wait: float, what: str) -> str:
    """Job `pid`'s whole answer to `request`; `what` names the answer in the error lines."""
    path = socket_path(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(wait)
        try:
            sock.connect(str(path))
            sock.sendall(request)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except FileNotFoundError:
            raise NoJob(f"no distrun job of yours with pid {pid}") from None
        except ConnectionRefusedError:
            raise NoJob(f"distrun job {pid} is gone") from None
        except TimeoutError:
            raise NoAnswer(f"distrun job {pid} did not answer within {wait:g}s") from None
        except OSError as err:
            raise NoJob(f"distrun job {pid}: {err.strerror or err}") from None
    if not chunks:
        raise NoJob(f"distrun job {pid} ended before its {what} were read")
    return b"".join(chunks).decode(errors="replace")


def ask_stacks(pid: int | None, wait: float) -> str:
    """The stacks of job `pid` (None: the user's one running job) as the job formats them."""
    pid = find_job(pid)
    give_up_at = time.monotonic() + wait
    text = ask(pid, REQUEST_STACKS, wait, "stacks")
    while text.startswith(BRIEFLY):
        doing = text.removeprefix(BRIEFLY).strip()
        if time.monotonic() + AGAIN_S >= give_up_at:
            raise JobBusy(f"distrun job {pid} is {doing} (its ranks run): ask again in a moment")
        time.sleep(AGAIN_S)  # the job names no event to wait for: its loop answers when it is free
        text = ask(pid, REQUEST_STACKS, give_up_at - time.monotonic(), "stacks")
    if text.startswith(BUSY):
        doing = text.removeprefix(BUSY).strip()
        raise JobBusy(f"distrun job {pid} runs no rank now: it is {doing}; ask again once its ranks run")
    return text


def ask_top(pid: int, wait: float) -> dict[str, object]:
    """Job `pid`'s live view: what it is doing and a row per rank (launcher.diagnose.live)."""
    text = ask(pid, REQUEST_TOP, wait, "samples")
    try:
        document = json.loads(text)
    except ValueError:
        raise NoJob(f"distrun job {pid} gave an answer that is not its samples") from None
    if not isinstance(document, dict):
        raise NoJob(f"distrun job {pid} gave an answer that is not its samples")
    return document
