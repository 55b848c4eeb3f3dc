"""Read the stacks of a host's ranks, for the agent (stdlib-only, Python 3.7; shipped with the agent).

Two ways, chosen per host:
- `py-spy dump` where py-spy is installed (on PATH, or beside the agent's interpreter): it reads a running
  interpreter from outside, so it sees any Python rank, and with `--native` it adds the native frames
  (NCCL, gloo, CUDA calls, libc) between the Python ones.
- otherwise the standard library: every rank the agent starts imports a small hook at start-up
  (launcher.agent.rankhook) that writes its stacks to a file when it receives STACK_SIGNAL: the main
  thread's from `faulthandler`, in C, even while it is blocked in a collective or in native code, and every
  thread's from a Python handler once the main thread runs Python. The hook comes in through the rank's
  environment, without a sitecustomize: PYTHONWARNINGS names a warning category of the hook's module, which
  Python imports while reading the option, and PYTHONPATH finds that module in the agent's private
  directory. The agent signals only a process whose signal mask shows the handler installed
  (/proc/PID/status), so a rank that is not Python, or not yet past start-up, is never killed by the
  signal: it is named with the reason instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.agent.progress import ANSWER_MODULE, ANSWER_SOURCE, ANSWER_WAIT, answer_path, ask, read
from launcher.agent.rankhook import HOOK_MODULE, HOOK_SOURCE, HOOK_VARIABLES, STACK_SIGNAL

if TYPE_CHECKING:
    from launcher.agent.stack_messages import StackReply

# faulthandler writes in several calls: the dump is complete once the file stopped growing for this long.
SETTLE_SECONDS = 0.05
# How often the agent looks at a gathering in progress.
POLL_SECONDS = 0.02
# faulthandler writes the main thread alone, and stops at 100 frames (innermost first, "  ..." for the
# rest): the whole stacks of a rank with threads, or of a deep one, come from the hook's Python handler, which
# runs as soon as the main thread runs Python code (launcher.agent.rankhook).
WHOLE_WAIT = 0.5
TRUNCATED = "  ..."
DIR_PREFIX = "distrun-stacks-"
# Held (flock) by the agent whose directory it is, for as long as it lives: the kernel lets go of it however
# the agent ends, SIGKILL included, so a directory whose lock can be taken is a leftover.
LOCK_NAME = "agent.lock"


def _leftover(path: str) -> bool:
    """Whether `path` is a dump directory of this user whose agent is gone. One without a lock file is left
    alone: its agent is still making it (or it is an earlier release's, whose agent may live)."""
    try:
        info = os.lstat(path)
        if not (info.st_uid == os.getuid() and os.path.isdir(path) and not os.path.islink(path)):
            return False
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        return False
    finally:
        os.close(fd)
    return True


def remove_leftovers(tmp: str) -> list[str]:
    """Remove the dump directories in `tmp` that agents killed with SIGKILL left (no agent can remove its
    own then); the directories removed."""
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(DIR_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(tmp, name)
        if _leftover(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class DumpDir:
    """The agent's private directory: the hook module, and the files the ranks' dumps are written to."""

    def __init__(self) -> None:
        remove_leftovers(tempfile.gettempdir())
        self.path = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")  # mode 0700
        # O_CLOEXEC: a rank must not hold the lock after its agent died. The lock file takes its name only
        # once held: another agent's remove_leftovers, between our open and flock, would take the lock itself
        # and remove this directory as a dead agent's.
        making = os.path.join(self.path, LOCK_NAME + ".new")
        self._lock = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.rename(making, os.path.join(self.path, LOCK_NAME))
        source = os.path.join(self.path, HOOK_MODULE + ".py")
        with open(source, "w") as f:
            f.write(HOOK_SOURCE)
        # Compiled once here, not in every rank (PYTHONDONTWRITEBYTECODE would make each compile it again);
        # a rank of another Python version compiles it itself.
        py_compile.compile(source, doraise=False)
        answers = os.path.join(self.path, ANSWER_MODULE + ".py")  # the ranks' collectives (progress)
        with open(answers, "w") as f:
            f.write(ANSWER_SOURCE)
        py_compile.compile(answers, doraise=False)

    def rank_env(self, env: dict[str, str]) -> dict[str, str]:
        """What a rank's environment `env` needs for the hook (the user's PYTHONPATH/PYTHONWARNINGS kept)."""
        path = env.get("PYTHONPATH")
        warnings = env.get("PYTHONWARNINGS")
        hook = f"ignore::{HOOK_MODULE}.Never,ignore::{ANSWER_MODULE}.Never"
        directory, signal_number = HOOK_VARIABLES
        return {
            directory: self.path,
            signal_number: str(STACK_SIGNAL),
            # After the user's entries: what their imports find stays the same.
            "PYTHONPATH": path + os.pathsep + self.path if path else self.path,
            "PYTHONWARNINGS": warnings + "," + hook if warnings else hook,
        }

    def stack_file(self, pid: int) -> str:
        return os.path.join(self.path, f"{pid}.stack")

    def whole_file(self, pid: int) -> str:
        return os.path.join(self.path, f"{pid}.whole")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)


def find_py_spy() -> str | None:
    """py-spy on PATH, else beside this interpreter (a virtual environment's bin/ need not be on PATH)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


def _catches(pid: int, signum: int) -> bool | None:
    """Whether process `pid` has a handler for `signum` (None: the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        return None
    return False


def _state(pid: int) -> str:
    """The state letter of /proc/PID/status (`R`, `S`, `T` stopped, `t` stopped by a tracer, `Z` ...); "" when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1]
    except (OSError, IndexError):
        pass
    return ""


def unreadable_state(pid: int) -> str:
    """Why a process in its present state cannot give its stacks, at once; "" when it can be asked. A stopped
    process runs no signal handler and py-spy finds no interpreter in it: asking would only wait."""
    state = _state(pid)
    if state in ("", "Z", "X"):
        return "it has exited"
    if state == "T":
        return f"it is stopped (SIGSTOP or SIGTSTP; kill -CONT {pid} resumes it)"
    if state == "t":
        return "it is stopped by a debugger (tracing stop)"
    return ""


def _program(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return "?"


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def _threaded(pid: int) -> bool:
    """Whether the process runs threads besides its main one (native ones too: no outside view tells them
    apart from Python's)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def python_process(pid: int) -> int:
    """The process to read for a rank: the rank itself, or where it is not Python (a shell script, `bash -c`
    running python), its first Python descendant; the rank itself when it has none."""
    if "python" in _program(pid):
        return pid
    queue = _children(pid)
    while queue:
        child = queue.pop(0)
        if "python" in _program(child):
            return child
        queue.extend(_children(child))
    return pid


def signal_main_thread(pid: int, signum: int) -> None:
    """Signal `pid`'s main thread, not whichever the kernel picks: faulthandler's C handler writes the frames
    of the thread it runs in, and run in a native thread it read the main thread's as they changed (the
    hook's handler, under load): SIGSEGV. No tgkill, or the main thread gone: the process."""
    try:
        import ctypes

        tgkill = ctypes.CDLL(None).tgkill
    except (ImportError, OSError, AttributeError):
        tgkill = None
    if tgkill is None or tgkill(pid, pid, signum) != 0:
        os.kill(pid, signum)  # raises where the process itself is gone or not ours, as before


def parse_faulthandler(text: str) -> list[dict[str, Any]]:
    """faulthandler's dump as threads (frames outermost first). It lists the newest thread first, so the
    main thread, the oldest, is the last."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent call first)")):
            threads.append({"name": "", "frames": []})  # the last: the hook's (the main thread alone)
        elif line.rstrip() == TRUNCATED and threads:
            threads[-1]["truncated"] = True  # the outermost frames are missing
        elif line.startswith('  File "') and threads:
            # '  File "path", line N in func'
            path, _, rest = line[len('  File "') :].rpartition('", line ')
            number, _, func = rest.partition(" in ")
            try:
                threads[-1]["frames"].insert(0, [func, path, int(number)])
            except ValueError:
                continue
    if threads:
        threads[-1]["main"] = True
    return threads


def parse_whole(text: str) -> list[dict[str, Any]]:
    """The hook's Python handler's dump as threads: a `thread MAIN NAME` line each (tab-separated), then its
    frames outermost first as `LINE FUNCTION FILE`. The main thread comes last, as in faulthandler's."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        fields = line.split("\t", 2)
        if fields[0] == "thread" and len(fields) == 3:
            threads.append({"name": fields[2], "main": fields[1] == "1", "frames": []})
        elif (
            len(fields) == 3
            and threads
            and len(fields[0]) <= 18
            and fields[0].isascii()
            and fields[0].isdigit()
        ):
            # A function name's newline can put anything first: "³", for which isdigit() holds, or more digits
            # than int() takes (4,300); our own line numbers are ASCII and short.
            threads[-1]["frames"].append([fields[1], fields[2], int(fields[0])])
    return sorted(threads, key=lambda t: bool(t["main"]))


def _line_number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_py_spy(text: str, pid: int) -> list[dict[str, Any]]:
    """py-spy's JSON dump as threads (frames outermost first, unresolved native addresses left out).
    ValueError where the text is no JSON (the agent then reads the rank with faulthandler); whatever else
    the JSON holds is read as far as it has threads and frames, the rest left out."""
    dump = json.loads(text)
    threads = []
    for thread in dump if isinstance(dump, list) else []:
        if not isinstance(thread, dict):
            continue
        frames = []
        listed = thread.get("frames")
        for frame in reversed(listed if isinstance(listed, list) else []):
            if not isinstance(frame, dict):
                continue
            native = frame.get("module") is not None
            name = str(frame.get("name", "?"))
            if native and name.startswith("0x"):
                continue  # an address, different in every process: it would split every group
            frames.append([name, str(frame.get("filename", "")), _line_number(frame.get("line")), native])
        threads.append(
            {
                "name": str(thread.get("thread_name") or ""),
                "main": thread.get("os_thread_id") == pid,
                "frames": frames,
            }
        )
    return threads


class _One:
    """One rank being read: py-spy first where asked, faulthandler otherwise (or when py-spy fails)."""

    def __init__(self, rank: int, pid: int, dump_dir: DumpDir, py_spy: str | None) -> None:
        self.rank = rank
        self.pid = pid
        self.dir = dump_dir
        self.result: dict[str, Any] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.py_spy_error = ""
        self.out_path = ""
        self.size = -1
        self.changed = 0.0
        self.py_spy = py_spy
        # faulthandler's dump when it was cut at its frame limit, while the whole one is awaited.
        self.cut: list[dict[str, Any]] | None = None
        self.whole_until = 0.0
        self.native_until: float | None = None

    def isolated(self, step: Callable[..., None], *args: float) -> None:
        """One step of reading the rank; where it fails, the rank is named with the error (py-spy stopped):
        the boundary of reading one rank, so that no error of it ends the agent, the job, or the others'."""
        if self.result is not None:
            return
        try:
            step(*args)
        except Exception as err:
            self.result = {"rank": self.rank, "pid": self.pid, "error": failed(err)}
            with contextlib.suppress(OSError):
                self._stop_py_spy()

    def begin(self, wait: float, now: float) -> None:
        self.pid = python_process(self.pid)
        self.out_path = os.path.join(self.dir.path, f"{self.pid}.py-spy")
        self.changed = now
        # Native frames need the symbols of every library (seconds for libtorch): past two thirds of the wait,
        # py-spy is asked again for the Python frames alone, which takes a fraction of a second.
        self.native_until = now + wait * 2 / 3
        state = unreadable_state(self.pid)
        if state:
            self._done(error=state)
        elif self.py_spy:
            self._py_spy(native=True)
        else:
            self._signal()

    def _py_spy(self, native: bool) -> None:
        assert self.py_spy is not None
        argv = [self.py_spy, "dump", "--pid", str(self.pid), "--json"] + (["--native"] if native else [])
        try:
            with open(self.out_path, "wb") as out:
                # Output to a file, not a pipe: a big dump must not block py-spy while we poll it.
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE
                )
        except OSError as exc:
            self.py_spy_error = f"py-spy: {exc}"
            self._signal()

    def _stop_py_spy(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stderr:
                self.proc.stderr.close()
            self.proc = None

    def _done(self, source: str = "", threads: Any = (), error: str = "") -> None:
        self.result = {"rank": self.rank, "pid": self.pid, "source": source, "threads": list(threads)}
        if error:
            self.result["error"] = error

    def _signal(self) -> None:
        caught = _catches(self.pid, STACK_SIGNAL)
        if caught is None:
            self._done(error="it has exited")
            return
        if not caught:
            program = _program(self.pid)
            if "python" not in program:
                self._done(error=f"not a Python process ({program})")
            else:
                self._done(error=self.py_spy_error or "no stack hook in it (a Python started with -I or -E?)")
            return
        try:
            if os.path.exists(self.dir.whole_file(self.pid)):
                os.unlink(self.dir.whole_file(self.pid))  # an earlier request's
            os.truncate(self.dir.stack_file(self.pid), 0)
            signal_main_thread(self.pid, STACK_SIGNAL)
        except OSError as exc:
            self._done(error=self.py_spy_error or f"cannot signal it: {exc.strerror or exc}")

    def poll(self, now: float) -> None:
        if self.result is not None:
            return
        if self.proc is not None:
            code = self.proc.poll()
            if code is None and self.native_until is not None and now >= self.native_until:
                self.native_until = None
                self._stop_py_spy()
                self._py_spy(native=False)
                return
            if code is None:
                return
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            if self.proc.stderr:
                self.proc.stderr.close()
            self.proc = None
            if code == 0:
                try:
                    with open(self.out_path) as f:
                        self._done("py-spy", parse_py_spy(f.read(), self.pid))
                    return
                except (OSError, ValueError) as exc:
                    err = str(exc)
            lines = [line for line in err.strip().splitlines() if line.strip()]
            self.py_spy_error = "py-spy: " + (lines[-1] if lines else f"exit {code}")
            self._signal()
            return
        if self.cut is not None:
            self._await_whole(now)
            return
        try:
            size = os.path.getsize(self.dir.stack_file(self.pid))
        except OSError:
            size = 0
        if size != self.size:
            self.size, self.changed = size, now
        elif size and now - self.changed >= SETTLE_SECONDS:
            with open(self.dir.stack_file(self.pid), errors="replace") as f:
                threads = parse_faulthandler(f.read())
            if _threaded(self.pid) and threads:
                threads[-1]["others_unread"] = True  # until the whole stacks come
            if any(t.get("truncated") or t.get("others_unread") for t in threads):
                self.cut, self.whole_until = threads, now + WHOLE_WAIT
                self._await_whole(now)
            else:
                self._done("faulthandler", threads)

    def _await_whole(self, now: float) -> None:
        """The whole stacks, once the rank's Python handler wrote them; faulthandler's (marked: cut, or the
        main thread's alone) when it does not run soon (its main thread is blocked outside Python)."""
        try:
            with open(self.dir.whole_file(self.pid)) as f:
                self._done("faulthandler", parse_whole(f.read()))
            return
        except (OSError, ValueError, TypeError, IndexError):
            pass
        if now >= self.whole_until and self.cut is not None:
            self._done("faulthandler", self.cut)

    def give_up(self, waited: float) -> None:
        if self.result is None and self.cut is not None:
            self._done("faulthandler", self.cut)
        elif self.result is None:
            self._stop_py_spy()
            self._done(error=f"no stacks within {waited:g}s")


def failed(err: BaseException, what: str = "reading its stacks") -> str:
    """Why `what` failed, on one line (`reading its stacks failed: ValueError: ...`): the rank is named with
    it and the job runs on."""
    text = " ".join(str(err).split())
    return f"{what} failed: " + (f"{type(err).__name__}: {text}" if text else type(err).__name__)


class Gathering:
    """Reading every listed rank at once; `poll` until `done`, then `results` (one dict per rank)."""

    def __init__(
        self, request_id: int, ranks: dict[int, int], dump_dir: DumpDir, *, tool: str, wait: float, now: float
    ) -> None:
        self.request_id = request_id
        self.started = now
        self.deadline = now + wait
        py_spy = find_py_spy() if tool in ("auto", "py-spy") else None
        self.missing = "py-spy is not installed on this host" if tool == "py-spy" and not py_spy else ""
        self.ones = [] if self.missing else [_One(r, p, dump_dir, py_spy) for r, p in ranks.items()]
        for one in self.ones:
            one.isolated(one.begin, wait, now)
        self.ranks = ranks
        # Each rank's latest collectives (launcher.agent.progress), asked beside its stacks.
        self.dir = dump_dir.path
        self.asked = {one.pid for one in self.ones if ask(self.dir, one.pid, fresh=True)}
        self.stacks_in: float | None = None

    @property
    def done(self) -> bool:
        stacks = all(one.result is not None for one in self.ones)
        return stacks and all(os.path.exists(answer_path(self.dir, pid)) for pid in self.asked)

    def poll(self, now: float) -> bool:
        for one in self.ones:
            one.isolated(one.poll, now)
        if now >= self.deadline:
            for one in self.ones:
                one.isolated(one.give_up, self.deadline - self.started)
        if self.asked and all(one.result is not None for one in self.ones):
            # The stacks are in: the answers get a moment more, then the ranks that gave none go without.
            self.stacks_in = now if self.stacks_in is None else self.stacks_in
            if now >= self.stacks_in + ANSWER_WAIT:
                self.asked = set()
        return self.done

    def results(self) -> list[dict[str, Any]]:
        if self.missing:
            return [{"rank": r, "pid": p, "error": self.missing} for r, p in self.ranks.items()]
        out = []
        for one in self.ones:
            if one.result is None:
                continue
            result = dict(one.result)
            # The thread that answers for the rank's collectives is distrun's, not the rank's.
            result["threads"] = [t for t in result.get("threads", ()) if not _answering(t)]
            records = read(self.dir, one.pid)
            if records is not None:
                result["collectives"] = records
            out.append(result)
        return out


def _answering(thread: dict[str, Any]) -> bool:
    hook = ANSWER_MODULE + ".py"
    return any(str(frame[1]).endswith(hook) for frame in thread.get("frames", ()) if len(frame) > 1)


def stack_reply(request_id: int, ranks: list[dict[str, Any]] | None = None) -> StackReply:
    """The STACK_DUMP answering StacksRequest `request_id` (its type loads with the first: start-up time)."""
    from launcher.agent.stack_messages import StackReply

    return StackReply(request_id, ranks or [])
