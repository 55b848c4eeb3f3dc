"""A collectives script that ends as most do: without collectives.shutdown().

argv[1] says how: `return` falls off the end, `exit0` calls sys.exit(0), `raise` raises in rank 1 while the
others wait in a barrier, `exit3` calls sys.exit(3) in rank 1 while the others wait in a barrier.
"""

import sys

import torch

import collectives

how = sys.argv[1]
collectives.init(backend="gloo")
rank = collectives.rank()
total = collectives.allreduce(torch.ones(4) * (rank + 1))
gathered = collectives.allgather(torch.tensor([rank]))
print(f"rank {rank}: mean={total.tolist()} gathered={gathered.tolist()}", flush=True)
if rank == 1 and how == "raise":
    raise RuntimeError("rank 1 gives up")
if rank == 1 and how == "exit3":
    sys.exit(3)
if how in ("raise", "exit3"):
    collectives.barrier()  # never completes: rank 1 is gone
if how == "exit0":
    sys.exit(0)
