"""A rank whose main thread waits in native code while its other threads run Python: DIR.

Three threads make and drop nested generators all the time (their frames come and go, as a data loader's
do); the main thread waits on a pthread condition variable (through ctypes, the GIL released, as in a
collective's C++: a signal does not end that wait, so no Python handler runs) until a thread sees
DIR/release. That thread writes DIR/<pid>.pid once the main thread waits (it holds the mutex until then).
Exits 0 then.
"""

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

out = Path(sys.argv[1])


def nested(depth: int):  # type: ignore[no-untyped-def]
    if depth:
        yield from nested(depth - 1)
    else:
        yield depth


def churn() -> None:
    while True:
        next(nested(40))


libc = ctypes.CDLL(None)
# glibc's static initializers are all zeros; 64 bytes hold either type.
mutex, cond, released = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64), ctypes.c_int(0)


def gate() -> None:
    libc.pthread_mutex_lock(mutex)  # once the main thread waits: it let go of the mutex in the wait
    (out / f"{os.getpid()}.pid").write_text(str(os.getpid()))
    libc.pthread_mutex_unlock(mutex)
    while not (out / "release").exists():
        time.sleep(0.05)
    libc.pthread_mutex_lock(mutex)
    released.value = 1
    libc.pthread_cond_signal(cond)
    libc.pthread_mutex_unlock(mutex)


def wait_in_native() -> None:
    while not released.value:
        libc.pthread_cond_wait(cond, mutex)
    libc.pthread_mutex_unlock(mutex)


for _ in range(3):
    threading.Thread(target=churn, daemon=True).start()
libc.pthread_mutex_lock(mutex)
threading.Thread(target=gate, daemon=True).start()
wait_in_native()
