"""One of 4 ranks is behind: the others wait in a named allreduce that rank 3 never issues.

skip_allreduce.py READY_DIR MODE: MODE `skip`, every rank runs 3 steps of named allreduces, then rank 3 sleeps
in `data_loader` while the others wait in `grad.layer4.weight`; MODE `idle`, rank 3 issues nothing after
init() while the others wait in `only_me`. Each rank writes READY_DIR/RANK.pid just before it blocks.
"""

import os
import sys
import time

import torch

import collectives as hvd


def data_loader() -> None:
    time.sleep(600)


hvd.init()
rank = hvd.rank()
ready, mode = sys.argv[1], sys.argv[2]
if mode == "skip":
    for _ in range(3):
        hvd.allreduce(torch.ones(4), name="grad.layer3.weight")
        hvd.allreduce(torch.ones(4), name="grad.layer3.bias")
name = "grad.layer4.weight" if mode == "skip" else "only_me"
with open(os.path.join(ready, f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
if rank == 3:
    data_loader()
hvd.allreduce(torch.ones(4), name=name)
