"""A hung job: rank 2 sleeps in a function of its own while every other rank waits in a gloo barrier.

hang.py READY_DIR: each rank writes READY_DIR/RANK.pid just before it blocks.
"""

import os
import sys
import time

import torch.distributed as dist


def stuck_in_loader() -> None:
    time.sleep(600)


dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} joined", flush=True)
with open(os.path.join(sys.argv[1], f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
if rank == 2:
    stuck_in_loader()
dist.barrier()
