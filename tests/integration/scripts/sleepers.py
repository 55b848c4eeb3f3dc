"""No torch, quick to start: rank 1 sleeps in `odd_one_out`, the others in `with_the_rest`.

sleepers.py READY_DIR: each rank writes READY_DIR/RANK.pid just before it sleeps.
"""

import os
import sys
import time


def odd_one_out() -> None:
    time.sleep(600)


def with_the_rest() -> None:
    time.sleep(600)


rank = int(os.environ["RANK"])
with open(os.path.join(sys.argv[1], f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
odd_one_out() if rank == 1 else with_the_rest()
