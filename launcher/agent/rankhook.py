"""The stack hook every rank imports at start-up (stdlib-only, Python 3.7; shipped with the agent): its
source, written to the agent's private directory, and what the agent tells it through the rank's environment.

On STACK_SIGNAL, sent to the rank's main thread, two handlers answer:
- faulthandler's, in C, at once, even while the main thread is blocked in a collective or in native code. It
  writes the main thread's frames alone: its own, which nothing changes while it runs. Asked for every
  thread's (`all_threads`), it reads the others' frames without the GIL while they run Python, and a rank
  whose main thread waited in native code while other threads made generators died of SIGSEGV within
  21-506 requests (tests/integration/test_stack_signal.py).
- a Python handler chained behind it, which writes every thread's whole stack under the GIL as soon as the
  main thread runs Python again: at once from sleep(), select(), a lock or a loop in Python (the signal
  interrupts the wait); not while it waits in a collective's C++ or CUDA, where py-spy reads them instead.
"""

from __future__ import annotations

import signal

HOOK_MODULE = "distrun_rankhook"
# What the agent adds to each rank's environment for the hook: a distrun started inside a rank sees them.
HOOK_VARIABLES = ("DISTRUN_STACK_DIR", "DISTRUN_STACK_SIGNAL")
# A real-time signal: the user's own SIGUSR1/SIGUSR2 handlers (which distrun forwards) stay untouched.
STACK_SIGNAL = int(getattr(signal, "SIGRTMAX", 64)) - 2
HOOK_SOURCE = """\
import _thread, faulthandler, os, sys

_where = os.environ.get("DISTRUN_STACK_DIR")


def _whole(signum, frame):
    \"""Every thread's whole stack; faulthandler, in C, answered first with the main thread's alone, cut at
    100 frames. It runs in the main thread between two bytecodes of whatever that was doing, so it takes no
    lock (threading's own would deadlock a main thread interrupted while holding it) and imports nothing.\"""
    try:
        threading = sys.modules.get("threading")
        active = dict(getattr(threading, "_active", None) or {})
        here = _thread.get_ident()
        lines = []
        for ident, top in sys._current_frames().items():
            top = frame if ident == here else top
            thread = active.get(ident)
            name = getattr(thread, "_name", "") if thread is not None else ""
            lines.append("thread\\t%d\\t%s" % (ident == here, str(name).replace("\\n", " ")))
            frames = []
            while top is not None:
                code = top.f_code
                frames.append("%d\\t%s\\t%s" % (top.f_lineno or 0, code.co_name, code.co_filename))
                top = top.f_back
            lines.extend(reversed(frames))
        path = os.path.join(_where, "%d.whole" % os.getpid())
        with open(path + ".tmp", "w") as f:
            f.write("\\n".join(lines) + "\\n")
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def _install():
    signum = os.environ.get("DISTRUN_STACK_SIGNAL")
    if not _where or not signum:
        return
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(os.path.join(_where, "%d.stack" % os.getpid()), flags, 0o600)
        try:
            try:
                # The C module: `signal` itself builds its enums (importing `enum`), ~9 ms of every rank's
                # start-up for a script that never imports either.
                import _signal as signal
            except ImportError:
                import signal

            signal.signal(int(signum), _whole)
            chain = True
        except (OSError, ValueError, RuntimeError, AttributeError):
            chain = False
        faulthandler.register(int(signum), file=fd, all_threads=False, chain=chain)
    except (OSError, ValueError, RuntimeError, AttributeError):
        pass


_install()


class Never(Warning):
    "The category PYTHONWARNINGS names so that Python imports this module; nothing ever raises it."
"""
