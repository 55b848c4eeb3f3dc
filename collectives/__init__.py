"""collectives: the worker-side half of distrun (Horovod's API on torch.distributed).

    import collectives as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Importing this package does not import torch (the launcher imports it); each name is loaded from its module
on first use. ``__init__.pyi`` tells type checkers what the names are.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> defining module. The single list of the package's names: __all__ is built from it, and
# __init__.pyi re-exports each module's own __all__ (a unit test checks that the two agree).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("load_checkpoint", "save_checkpoint"), "checkpoint"),
    **dict.fromkeys(("Compression", "Compressor"), "compression"),
    **dict.fromkeys(
        (
            "Topology",
            "backend",
            "cross_rank",
            "cross_size",
            "device",
            "is_coordinator",
            "is_homogeneous",
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
    **dict.fromkeys(("init",), "startup"),
    **dict.fromkeys(("SyncBatchNorm",), "sync_batch_norm"),
    **dict.fromkeys(
        (
            "ArgumentError",
            "CollectivesError",
            "EnvironmentContractError",
            "GradientSyncError",
            "HorovodInternalError",
            "HostsUpdatedInterrupt",
            "MetricKeysMismatchError",
            "MismatchError",
            "NotInitializedError",
            "ShardingError",
        ),
        "errors",
    ),
    **dict.fromkeys(
        (
            "ccl_built",
            "cuda_built",
            "ddl_built",
            "gloo_built",
            "gloo_enabled",
            "mpi_built",
            "mpi_enabled",
            "mpi_threads_supported",
            "nccl_built",
            "rocm_built",
            "start_timeline",
            "stop_timeline",
        ),
        "features",
    ),
    **dict.fromkeys(("barrier", "join"), "coordination"),
    **dict.fromkeys(("ScalingRule", "WarmupSchedule", "scale_lr"), "lr"),
    **dict.fromkeys(("average_metrics", "reduce_metrics"), "metrics"),
    **dict.fromkeys(("allgather_object", "broadcast_object"), "objects"),
    **dict.fromkeys(
        (
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
        ),
        "ops",
    ),
    **dict.fromkeys(("broadcast_optimizer_state", "broadcast_parameters"), "broadcast_state"),
    **dict.fromkeys(("DistributedOptimizer",), "optimizer"),
    **dict.fromkeys(
        ("ProcessSet", "add_process_set", "global_process_set", "remove_process_set"), "process_sets"
    ),
    **dict.fromkeys(("Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum"), "reduce_op"),
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name == "elastic":
        # `hvd.elastic`, as horovod.torch has it: a subpackage, loaded on first use like every other name.
        return importlib.import_module("collectives.elastic")
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'collectives' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"collectives.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
