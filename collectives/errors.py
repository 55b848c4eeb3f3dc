"""Exceptions raised by collectives; all derive from :class:`CollectivesError`."""

from __future__ import annotations

__all__ = [
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
]


class CollectivesError(RuntimeError):
    """Base class of every error collectives raises on purpose."""


class NotInitializedError(CollectivesError):
    """An operation needs the process group, but ``collectives.init()`` has not been called."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"collectives.{what}() needs the process group, but collectives.init() has not been called "
            "(call collectives.init() once at the start of the training script)"
        )


class EnvironmentContractError(CollectivesError):
    """The worker environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) is missing values or inconsistent."""


class GradientSyncError(CollectivesError):
    """DistributedOptimizer's gradient synchronisation was used in a way that would give wrong gradients."""


class MetricKeysMismatchError(CollectivesError):
    """average_metrics() was called with different metric names on different ranks."""


class ShardingError(CollectivesError):
    """A data set cannot be sharded as asked (for example fewer samples than ranks)."""


class MismatchError(CollectivesError):
    """Ranks called a collective with different shapes, dtypes, ops, names or roots, or different collectives.

    Raised on every rank of the process set, as Horovod's coordinator does, instead of a hang or garbage.
    """


class HorovodInternalError(CollectivesError):
    """Horovod's name for a failed collective, kept so that ``except hvd.HorovodInternalError`` works.

    Under ``hvd.elastic.run`` it means a peer is gone: the state rolls back to its last commit and the
    survivors form a new world."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed (``hvd.elastic``): raised at the next commit or host check on every rank at
    once; the state is kept (no rollback). ``skip_sync``: only hosts were removed, so every survivor already
    holds the same state."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


class ArgumentError(CollectivesError, ValueError):
    """A collective's arguments are invalid on this rank (Horovod raises ValueError for these)."""
