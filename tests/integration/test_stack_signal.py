"""The stack signal goes to a rank's main thread, never to another of its threads (tests/integration: a real
process). The main thread blocks the signal and a helper thread does not: sent to the process, the kernel
gives it to the helper (the handler runs); sent to the main thread, it stays pending there. And the rank's
hook answers it without harm while the main thread waits in native code and other threads run Python."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.agent.rankhook import STACK_SIGNAL
from launcher.agent.stackdump import DumpDir, parse_faulthandler, signal_main_thread
from tests.support import SCRIPTS, wait_for_files

# "Pending in the main thread" is read from the main thread's own pending set (SigPnd), not sigpending(),
# which adds the process's: a signal sent to the process waits there until the helper is scheduled to take
# it, which under load came after the main thread looked.
CHILD = """
import signal, sys, threading, time
signum = int(sys.argv[1])
handled = threading.Event()
signal.signal(signum, lambda *_: handled.set())
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # unblocked: it was made before the mask
signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
status = "/proc/self/task/%d/status" % threading.get_native_id()

def pending_here():
    with open(status) as f:
        line = next(line for line in f if line.startswith("SigPnd:"))
    return int(line.split()[1], 16) >> (signum - 1) & 1

print("ready", flush=True)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    if pending_here():
        print("pending in the main thread", flush=True)
        break
    if handled.is_set():
        print("handled by another thread", flush=True)
        break
    time.sleep(0.01)
"""


def _received(send: Callable[[int, int], None]) -> str:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(STACK_SIGNAL)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        send(child.pid, STACK_SIGNAL)
        return child.stdout.readline().strip()
    finally:
        child.kill()
        child.wait()


def test_the_stack_signal_reaches_the_main_thread_not_another() -> None:
    assert _received(signal_main_thread) == "pending in the main thread"


def test_a_signal_sent_to_the_process_goes_to_a_thread_that_takes_it() -> None:
    # The control: what the agent did before, and what a plain `kill` does.
    assert _received(os.kill) == "handled by another thread"


def test_a_rank_waiting_in_native_code_while_its_threads_run_python_survives_every_request(
    tmp_path: Path,
) -> None:
    """1000 requests, each awaited, to scripts/native_wait.py (its main thread in a condition wait, three
    threads making and dropping generators): the rank lives on, and the answer is its main thread's stack.
    With faulthandler asked for every thread's, such a rank died of SIGSEGV, 4 runs of 4 (requests 21-506)."""
    dump = DumpDir()
    rank = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "native_wait.py"), str(tmp_path)],
        env={**os.environ, **dump.rank_env(dict(os.environ))},
    )
    try:
        wait_for_files(tmp_path, "*.pid", 1)
        stack_file = Path(dump.stack_file(rank.pid))
        for request in range(1000):
            _dumped_once_more(rank, stack_file, request)
            assert rank.poll() is None, f"the rank died ({rank.returncode}) at request {request + 1}"
        threads = parse_faulthandler(stack_file.read_text())
        assert threads[-1]["main"] and threads[-1]["frames"][-1][0] == "wait_in_native", threads[-1]
        assert not os.path.exists(dump.whole_file(rank.pid)), "the main thread never ran Python meanwhile"
        (tmp_path / "release").write_text("")
        assert rank.wait(timeout=60) == 0
    finally:
        rank.kill()
        rank.wait()
        dump.remove()


def _dumped_once_more(rank: subprocess.Popen[bytes], stack_file: Path, done: int) -> None:
    """Signal the rank until its dump number `done + 1` is whole (it ends with the outermost frame), or it
    died. Asked again every 0.2 s: faulthandler skips a request that comes while it writes a dump, and one
    that comes while it calls the chained handler (it sets that one in its place meanwhile)."""
    asked, deadline = 0.0, time.monotonic() + 60
    while rank.poll() is None and stack_file.read_text().count(" in <module>\n") <= done:
        assert time.monotonic() < deadline, f"no dump {done + 1} within 60 s"
        if time.monotonic() - asked > 0.2:
            signal_main_thread(rank.pid, STACK_SIGNAL)
            asked = time.monotonic()
        time.sleep(0.002)
