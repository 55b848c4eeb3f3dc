"""distrun: start a distributed training job on every host with one command."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Iterator

__version__ = "0.1.0"
EXIT_SIGINT = 130  # launcher.errors.EXIT_SIGINT, not imported: nothing runs before the guard below


@contextlib.contextmanager
def without_gc() -> Iterator[None]:
    """For distrun's own imports: they allocate tens of thousands of objects and free almost none, and the
    collector's passes over them were ~5% of a no-op job's start-up. In the `distrun` command, what they
    made is then frozen out of every later pass (``gc.freeze``): merely re-enabled, the collector's next pass
    walked all of it, 25-30 ms on 2 cores, and each full pass of a long job walked it again. A program that
    runs the CLI in-process (tests) keeps its own objects within the collector's reach."""
    gc.disable()
    try:
        yield
    finally:
        if _started_as_distrun():
            gc.freeze()
        gc.enable()


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C while distrun is still starting (importing): nothing runs yet, so one line and 130."""
    with contextlib.suppress(OSError):  # a closed stderr
        os.write(2, b"distrun: error: interrupted by SIGINT before any rank started\n")
    os._exit(EXIT_SIGINT)


def release_start_guard() -> None:
    """The CLI takes over Ctrl-C (KeyboardInterrupt, then its signal handling): undo the guard below."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _started_as_distrun() -> bool:
    """The `distrun` command or `python -m launcher`, not a program importing the package."""
    if sys.argv and os.path.basename(sys.argv[0]) == "distrun":
        return True
    orig = getattr(sys, "orig_argv", [])
    return "-m" in orig and orig[orig.index("-m") + 1 : orig.index("-m") + 2] == ["launcher"]


# Started as distrun, Ctrl-C is guarded from this first instruction on; imported as a library (tests, the
# local agent) nothing changes. An ignored SIGINT (a background job of a script) stays ignored.
if _started_as_distrun():
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
    # Before any record is made: their methods' code comes from the cache (launcher/agent/dataclass_code.py).
    from launcher.agent import dataclass_code
    from launcher.agent.cache_root import private_code_dir

    dataclass_code.install(private_code_dir(), "launcher")
