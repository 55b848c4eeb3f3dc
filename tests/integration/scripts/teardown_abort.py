"""A job whose ranks all print their result, and whose last rank then dies of SIGABRT at interpreter exit,
as torch can in its teardown when a script leaves its process group to the interpreter's exit: os.abort()
in an atexit handler stands in for it. The others exit 0 first: rank 0 tells the last rank its pid through
the FIFO `FIFO`, and the last rank leaves once that process has ended (every rank runs on one host).

usage: teardown_abort.py FIFO
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import sys

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
fifo = sys.argv[1]
print(f"rank {rank}: accuracy 0.93", flush=True)
if rank == 0:
    with open(fifo, "w") as peer:
        peer.write(str(os.getpid()))
elif rank == size - 1:
    with open(fifo) as peer:
        pid = int(peer.read())
    # Readable once rank 0 has ended (its agent then reaps it first); gone already is as good.
    with contextlib.suppress(ProcessLookupError):
        ended = os.pidfd_open(pid)
        select.select([ended], [], [])
    atexit.register(os.abort)
