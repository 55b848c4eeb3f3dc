"""gloo all_reduce through torch's env:// rendezvous, as any torch.distributed script does it."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()} sum={t.item():g} host={os.environ['DISTRUN_HOSTNAME']}")
dist.destroy_process_group()
