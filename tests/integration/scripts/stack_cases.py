"""Ranks in states `distrun stacks` must name well (issue 27), no torch.

stack_cases.py READY_DIR MODE: each rank writes READY_DIR/RANK.pid (and RANK.dir, its agent's stack-hook
directory) just before it settles. MODE:
- deep: rank 0 recurses 150 calls deep from `from_left`, rank 1 from `from_right`; both then sleep
  (their innermost 100 frames are alike, so only the whole stacks tell them apart).
- deep-in-c: as deep, but both then block in C for good (a mutex locked twice), where no Python handler runs.
- stopped: rank 1 stops itself with SIGSTOP; the others sleep.
"""

import os
import signal
import sys
import time

ready, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])


def settle() -> None:
    with open(os.path.join(ready, f"{rank}.dir"), "w") as f:
        f.write(os.environ.get("DISTRUN_STACK_DIR", ""))
    with open(os.path.join(ready, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if mode == "stopped" and rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    if mode == "deep-in-c":
        import ctypes

        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroes: PTHREAD_MUTEX_INITIALIZER, a normal mutex
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # never returns, signals or not
    time.sleep(600)


def walk(depth: int) -> None:
    if depth == 0:
        settle()
    else:
        walk(depth - 1)


def from_left() -> None:
    walk(150)


def from_right() -> None:
    walk(150)


if mode in ("deep", "deep-in-c"):
    from_left() if rank == 0 else from_right()
else:
    settle()
