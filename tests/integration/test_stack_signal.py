"""The stack signal goes to a rank's main thread, never to another of its threads (tests/integration: a real
process). The main thread blocks the signal and a helper thread does not: sent to the process, the kernel
gives it to the helper (the handler runs); sent to the main thread, it stays pending there."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from launcher.agent.stackdump import STACK_SIGNAL, signal_main_thread

CHILD = """
import signal, sys, threading, time
signum = int(sys.argv[1])
handled = threading.Event()
signal.signal(signum, lambda *_: handled.set())
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # unblocked: it was made before the mask
signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
print("ready", flush=True)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    if signum in signal.sigpending():
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
