"""Horovod's tensor collectives on torch.distributed, with Horovod's signatures and semantics.

Every collective first agrees with its peers on what it is about to do (``collectives.negotiation``), so a
rank that passes another shape, dtype, op, name or root gets :class:`MismatchError` on every rank instead of
a hang. Out-of-place functions return new tensors and are differentiable as Horovod's are; in-place
variants end in ``_``; ``*_async`` variants return a :class:`Handle` for :func:`poll` and
:func:`synchronize`. All ranks of a process set must call its collectives in the same order.

Each family has a module of its own, with its blocking, ``_async`` and in-place variants and its autograd
Function: ``_allreduce``, ``_grouped_allreduce``, ``_allgather``, ``_broadcast``, ``_alltoall``,
``_reducescatter`` and ``_sparse`` (the sparse allreduce). What they share lies below them: ``_handle``
(handles and the agreement before a collective starts) and ``_common`` (op arguments, the scaling chain, the
carried layout). The modules are private, named apart from the functions they define: users reach every
name here, in ``collectives.ops``.
"""

from __future__ import annotations

from collectives.ops._allgather import allgather, allgather_async, grouped_allgather, grouped_allgather_async
from collectives.ops._allreduce import allreduce, allreduce_, allreduce_async, allreduce_async_
from collectives.ops._alltoall import alltoall, alltoall_async
from collectives.ops._broadcast import broadcast, broadcast_, broadcast_async, broadcast_async_
from collectives.ops._grouped_allreduce import (
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from collectives.ops._handle import Handle, poll, synchronize
from collectives.ops._reducescatter import (
    grouped_reducescatter,
    grouped_reducescatter_async,
    reduce_scatter,
    reducescatter,
    reducescatter_async,
)
from collectives.ops._sparse import sparse_allreduce_async

__all__ = [
    "Handle",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "poll",
    "reduce_scatter",
    "reducescatter",
    "reducescatter_async",
    "sparse_allreduce_async",
    "synchronize",
]
