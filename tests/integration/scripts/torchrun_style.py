"""An unmodified torchrun-style script: env:// init, reads LOCAL_RANK, uses the group."""

import os

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group(backend="gloo", init_method="env://")
    x = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    print(f"local_rank={local_rank} world={dist.get_world_size()} max={x[0].item():g}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
