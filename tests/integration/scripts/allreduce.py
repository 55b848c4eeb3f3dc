"""gloo all_reduce through torch's env:// rendezvous, as any torch.distributed script does it.

allreduce.py [DIR [ARG...]]: with DIR, each rank also writes what scripts/envdump.py writes to DIR/RANK.json
(its environment, ARGs, working directory), so one job shows both."""

import json
import os
import sys

import torch
import torch.distributed as dist

if len(sys.argv) > 1:
    with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.json"), "w") as f:
        json.dump({"env": dict(os.environ), "argv": sys.argv[2:], "cwd": os.getcwd()}, f)
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()} sum={t.item():g} host={os.environ['DISTRUN_HOSTNAME']}")
dist.destroy_process_group()
