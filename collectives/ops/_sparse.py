"""Sparse allreduce, Horovod's way: every rank's indices and values gathered, not reduced."""

from __future__ import annotations

from collections.abc import Callable

import torch

from collectives.ops._allgather import allgather_async
from collectives.ops._common import _sum_or_average
from collectives.process_sets import ProcessSet, global_process_set, groups_of
from collectives.reduce_op import ReduceOp

__all__ = ["sparse_allreduce_async"]


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp | None = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by gathering every rank's indices and values (Horovod's way); returns a
    callable for :func:`synchronize` that gives the (uncoalesced) sparse sum, or average."""
    reduce_op = _sum_or_average(op, "sparse_allreduce")
    # Gathered along the first dimension, so the (ndim, nnz) indices travel transposed.
    indices = allgather_async(
        tensor._indices().t().contiguous(), None if name is None else f"{name}.indices", process_set
    )
    values = allgather_async(tensor._values(), None if name is None else f"{name}.values", process_set)
    size = groups_of(process_set, "sparse_allreduce_async").size

    def result() -> torch.Tensor:
        gathered_values = values.wait()
        gathered_indices = indices.wait()
        if reduce_op is ReduceOp.AVERAGE:
            gathered_values = gathered_values / size
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, tensor.size())

    return result
