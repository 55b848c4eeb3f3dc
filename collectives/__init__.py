"""collectives: the worker-side half of distrun (Horovod's API on torch.distributed).

    import collectives as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Importing this package does not import torch (the launcher imports it); each name is loaded from its module
on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from collectives.errors import (
    CollectivesError,
    EnvironmentContractError,
    GradientSyncError,
    MetricKeysMismatchError,
    NotInitializedError,
    ShardingError,
)
from collectives.reduce_op import Average, Max, Min, Product, ReduceOp, Sum

if TYPE_CHECKING:
    from collectives.checkpoint import load_checkpoint, save_checkpoint
    from collectives.compression import Compression, Compressor
    from collectives.context import (
        Topology,
        backend,
        barrier,
        cross_rank,
        cross_size,
        device,
        init,
        is_coordinator,
        is_initialized,
        local_rank,
        local_size,
        rank,
        shutdown,
        size,
        topology_from_env,
    )
    from collectives.data import ShardSampler, shard_indices
    from collectives.lr import WarmupSchedule, scale_lr
    from collectives.metrics import average_metrics, reduce_metrics
    from collectives.ops import (
        Handle,
        allgather,
        allgather_object,
        allreduce,
        allreduce_,
        allreduce_async,
        allreduce_async_,
        alltoall,
        broadcast,
        broadcast_,
        broadcast_object,
        grouped_allreduce,
        grouped_allreduce_,
        grouped_allreduce_async_,
        reduce_scatter,
    )
    from collectives.optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters

_LAZY: dict[str, str] = {
    **dict.fromkeys(("load_checkpoint", "save_checkpoint"), "checkpoint"),
    **dict.fromkeys(("Compression", "Compressor"), "compression"),
    **dict.fromkeys(
        (
            "Topology",
            "backend",
            "barrier",
            "cross_rank",
            "cross_size",
            "device",
            "init",
            "is_coordinator",
            "is_initialized",
            "local_rank",
            "local_size",
            "rank",
            "shutdown",
            "size",
            "topology_from_env",
        ),
        "context",
    ),
    **dict.fromkeys(("ShardSampler", "shard_indices"), "data"),
    **dict.fromkeys(("WarmupSchedule", "scale_lr"), "lr"),
    **dict.fromkeys(("average_metrics", "reduce_metrics"), "metrics"),
    **dict.fromkeys(
        (
            "Handle",
            "allgather",
            "allgather_object",
            "allreduce",
            "allreduce_",
            "allreduce_async",
            "allreduce_async_",
            "alltoall",
            "broadcast",
            "broadcast_",
            "broadcast_object",
            "grouped_allreduce",
            "grouped_allreduce_",
            "grouped_allreduce_async_",
            "reduce_scatter",
        ),
        "ops",
    ),
    **dict.fromkeys(
        ("DistributedOptimizer", "broadcast_optimizer_state", "broadcast_parameters"), "optimizer"
    ),
}

__all__ = [
    "Average",
    "CollectivesError",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "EnvironmentContractError",
    "GradientSyncError",
    "Handle",
    "Max",
    "MetricKeysMismatchError",
    "Min",
    "NotInitializedError",
    "Product",
    "ReduceOp",
    "ShardSampler",
    "ShardingError",
    "Sum",
    "Topology",
    "WarmupSchedule",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "average_metrics",
    "backend",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "cross_rank",
    "cross_size",
    "device",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async_",
    "init",
    "is_coordinator",
    "is_initialized",
    "load_checkpoint",
    "local_rank",
    "local_size",
    "rank",
    "reduce_metrics",
    "reduce_scatter",
    "save_checkpoint",
    "scale_lr",
    "shard_indices",
    "shutdown",
    "size",
    "topology_from_env",
]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'collectives' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"collectives.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
