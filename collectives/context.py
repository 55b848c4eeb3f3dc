"""Process-group lifecycle and the rank/size queries (Horovod's ``hvd.init()``, ``hvd.rank()``, ...).

The environment is read by a pure function, :func:`topology_from_env`, so it can be tested without processes.
torch is imported only by :func:`init` and the functions that talk to the process group: the launcher imports
this package and must not pay for torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from collectives.errors import CollectivesError, EnvironmentContractError, NotInitializedError

if TYPE_CHECKING:
    import torch

__all__ = [
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
]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits in the job. ``cross_*`` count hosts (nodes), as in Horovod."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        checks = (
            (self.size >= 1, "world size must be at least 1"),
            (0 <= self.rank < self.size, "RANK must be in [0, WORLD_SIZE)"),
            (1 <= self.local_size <= self.size, "local size must be in [1, WORLD_SIZE]"),
            (0 <= self.local_rank < self.local_size, "LOCAL_RANK must be in [0, local size)"),
            (1 <= self.cross_size <= self.size, "cross size must be in [1, WORLD_SIZE]"),
            (0 <= self.cross_rank < self.cross_size, "cross rank must be in [0, cross size)"),
        )
        for ok, message in checks:
            if not ok:
                raise EnvironmentContractError(f"{message}: {self}")


def _int_var(environ: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` that is set, as an int; the names are aliases in preference order."""
    for name in names:
        raw = environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            raise EnvironmentContractError(f"{name}={raw!r} is not an integer") from None
    return None


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """Read the topology from distrun's environment contract, with torchrun's names as fallbacks.

    No RANK and no WORLD_SIZE means a plain single process (world size 1), so the same training script runs
    with ``python train.py`` and with ``distrun -np 4 train.py``.
    """
    rank_ = _int_var(environ, "RANK")
    size_ = _int_var(environ, "WORLD_SIZE")
    if rank_ is None and size_ is None:
        return Topology(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)
    if rank_ is None or size_ is None:
        raise EnvironmentContractError(
            "RANK and WORLD_SIZE must be set together (got RANK="
            f"{environ.get('RANK')!r}, WORLD_SIZE={environ.get('WORLD_SIZE')!r})"
        )
    local_rank_ = _int_var(environ, "LOCAL_RANK")
    local_size_ = _int_var(environ, "LOCAL_SIZE", "LOCAL_WORLD_SIZE")
    cross_size_ = _int_var(environ, "CROSS_SIZE", "GROUP_WORLD_SIZE")
    if local_size_ is None:
        if cross_size_ not in (None, 1):
            raise EnvironmentContractError(
                f"LOCAL_SIZE (or LOCAL_WORLD_SIZE) must be set when the job spans {cross_size_} hosts"
            )
        local_size_ = size_
    if local_rank_ is None:
        # Without LOCAL_RANK the only safe reading is one host, where the local rank is the global one.
        if local_size_ != size_:
            raise EnvironmentContractError("LOCAL_RANK must be set when the job spans several hosts")
        local_rank_ = rank_
    cross_rank_ = _int_var(environ, "CROSS_RANK", "GROUP_RANK", "NODE_RANK")
    if cross_rank_ is None:
        cross_rank_ = rank_ // local_size_
    if cross_size_ is None:
        cross_size_ = -(-size_ // local_size_)
    master_addr = environ.get("MASTER_ADDR") or None
    master_port = _int_var(environ, "MASTER_PORT")
    if size_ > 1 and (master_addr is None or master_port is None):
        raise EnvironmentContractError(
            "MASTER_ADDR and MASTER_PORT must be set for a job with more than one rank "
            "(start it with distrun or torchrun)"
        )
    return Topology(
        rank=rank_,
        size=size_,
        local_rank=local_rank_,
        local_size=local_size_,
        cross_rank=cross_rank_,
        cross_size=cross_size_,
        master_addr=master_addr,
        master_port=master_port,
    )


@dataclasses.dataclass(frozen=True)
class _Context:
    topology: Topology
    backend: str
    # False when the user (or another library) created the default group before init(): shutdown() must
    # then leave it alone.
    owns_group: bool
    device_type: str


_context: _Context | None = None


def _require(what: str) -> _Context:
    if _context is None:
        raise NotInitializedError(what)
    return _context


def _resolve_backend(requested: str | None) -> str:
    import torch
    import torch.distributed as dist

    if requested is not None:
        return requested
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _as_timedelta(timeout: float | datetime.timedelta) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


def init(
    backend: str | None = None,
    timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    """Join the job's process group; call once at the start of the training script.

    ``backend`` defaults to ``"nccl"`` when CUDA is available and ``"gloo"`` otherwise. With nccl the current
    CUDA device is pinned to the local rank, so ``torch.device("cuda")`` means "my GPU". ``timeout`` (seconds
    or a timedelta) bounds every collective, so a dead peer turns into an error instead of a hang. Calling
    ``init()`` again is a no-op that returns the same topology. A default group created earlier by the user
    is adopted as is.
    """
    global _context
    if _context is not None:
        return _context.topology
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise CollectivesError("this torch build has no torch.distributed support")
    topology = topology_from_env(os.environ if environ is None else environ)
    if dist.is_initialized():
        # Another library got there first; trust the group over the environment for rank and size.
        topology = dataclasses.replace(topology, rank=dist.get_rank(), size=dist.get_world_size())
        chosen = str(dist.get_backend())
        _context = _Context(topology, chosen, owns_group=False, device_type=_device_type(chosen))
        _pin_device(_context)
        return topology

    chosen = _resolve_backend(backend)
    device_type = _device_type(chosen)
    context = _Context(topology, chosen, owns_group=True, device_type=device_type)
    _pin_device(context)
    kwargs: dict[str, object] = {"backend": chosen, "timeout": _as_timedelta(timeout)}
    if device_type == "cuda" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = torch.device("cuda", topology.local_rank)
    if topology.size == 1 and topology.master_addr is None:
        # A plain `python train.py`: an in-memory store needs no address or port.
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(store=store, rank=0, world_size=1, **kwargs)  # type: ignore[arg-type]
    else:
        dist.init_process_group(
            init_method="env://",
            rank=topology.rank,
            world_size=topology.size,
            **kwargs,  # type: ignore[arg-type]
        )
    _context = context
    _log.info(
        "joined process group: rank %d/%d (local %d/%d, host %d/%d), backend %s",
        topology.rank,
        topology.size,
        topology.local_rank,
        topology.local_size,
        topology.cross_rank,
        topology.cross_size,
        chosen,
    )
    return topology


def _device_type(backend_name: str) -> str:
    return "cuda" if "nccl" in backend_name.lower() else "cpu"


def _pin_device(context: _Context) -> None:
    if context.device_type != "cuda":
        return
    import torch

    count = torch.cuda.device_count()
    local = context.topology.local_rank
    if local >= count:
        raise EnvironmentContractError(
            f"local rank {local} has no GPU: this host has {count} CUDA device(s) but "
            f"{context.topology.local_size} ranks; start at most {count} ranks per host"
        )
    torch.cuda.set_device(local)


def is_initialized() -> bool:
    """Whether :func:`init` has been called (and :func:`shutdown` has not)."""
    return _context is not None


def rank() -> int:
    """Global rank of this process, in ``[0, size())``."""
    return _require("rank").topology.rank


def size() -> int:
    """Number of processes in the job."""
    return _require("size").topology.size


def local_rank() -> int:
    """Index of this process among the processes on its host; selects the GPU."""
    return _require("local_rank").topology.local_rank


def local_size() -> int:
    """Number of processes on this host."""
    return _require("local_size").topology.local_size


def cross_rank() -> int:
    """Index of this host among the job's hosts."""
    return _require("cross_rank").topology.cross_rank


def cross_size() -> int:
    """Number of hosts in the job."""
    return _require("cross_size").topology.cross_size


def is_coordinator() -> bool:
    """True on rank 0, the process that should log, write checkpoints and evaluate once."""
    return _require("is_coordinator").topology.rank == 0


def backend() -> str:
    """The torch.distributed backend in use ("nccl" or "gloo")."""
    return _require("backend").backend


def device() -> torch.device:
    """The device this rank computes on: its pinned GPU under nccl, else the CPU."""
    import torch

    context = _require("device")
    if context.device_type == "cuda":
        return torch.device("cuda", context.topology.local_rank)
    return torch.device("cpu")


def barrier() -> None:
    """Block until every rank has reached the barrier."""
    context = _require("barrier")
    import torch.distributed as dist

    if context.device_type == "cuda":
        dist.barrier(device_ids=[context.topology.local_rank])
    else:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group; :func:`init` may be called again afterwards."""
    global _context
    if _context is None:
        return
    import torch.distributed as dist

    if _context.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _context = None
