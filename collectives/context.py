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
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from collectives import leaving, links
from collectives.errors import CollectivesError, EnvironmentContractError, NotInitializedError
from collectives.placement import BackendChoice, GpuView, choose_backend, is_gpu_backend

if TYPE_CHECKING:
    import torch

__all__ = [
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
]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits in the job. ``cross_*`` count the hosts that have a rank at this local rank,
    as in Horovod (on even hosts: every host)."""

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
    local_rank_, local_size_, cross_rank_, cross_size_ = _placement_from_env(environ, rank_, size_)
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


def _placement_from_env(environ: Mapping[str, str], rank_: int, size_: int) -> tuple[int, int, int, int]:
    """(local rank, local size, cross rank, cross size) from the environment, derived where unambiguous."""
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
    # horovodrun's (and distrun's) HOROVOD_CROSS_* count only the hosts with a rank at this local rank, which
    # differs from the host count on uneven hosts; hvd.cross_rank() must say what Horovod says.
    horovod_rank, horovod_size = (_int_var(environ, f"HOROVOD_CROSS_{n}") for n in ("RANK", "SIZE"))
    if horovod_rank is not None and horovod_size is not None:
        cross_rank_, cross_size_ = horovod_rank, horovod_size
    return local_rank_, local_size_, cross_rank_, cross_size_


def _placement_from_hostnames(hosts: Sequence[str], rank_: int) -> tuple[int, int, int, int]:
    """(local rank, local size, cross rank, cross size) of ``rank_``, given every rank's host name.

    Hosts are numbered in order of their lowest rank, and ranks within a host in rank order.
    """
    mine = hosts[rank_]
    host_order = list(dict.fromkeys(hosts))
    return hosts[:rank_].count(mine), hosts.count(mine), host_order.index(mine), len(host_order)


def _adopted_topology(environ: Mapping[str, str], backend_name: str) -> Topology:
    """The topology of a default process group that someone else created before :func:`init`.

    The group's rank and size are the truth. The environment may describe another launch or nothing (a
    script that spawned its workers itself), so it is used only where it provably describes this group;
    otherwise the ranks exchange host names once to find their local and cross placement.
    """
    import torch.distributed as dist

    rank_, size_ = dist.get_rank(), dist.get_world_size()
    declared = {name: _int_var(environ, name) for name in ("RANK", "WORLD_SIZE")}
    for name, actual in (("RANK", rank_), ("WORLD_SIZE", size_)):
        if declared[name] is not None and declared[name] != actual:
            raise EnvironmentContractError(
                f"{name}={declared[name]} in the environment, but the process group created before "
                f"collectives.init() says {actual}: the environment describes another job"
            )
    env_is_complete = (
        None not in declared.values()
        and _int_var(environ, "LOCAL_RANK") is not None
        and _int_var(environ, "LOCAL_SIZE", "LOCAL_WORLD_SIZE") is not None
    )
    if env_is_complete:
        placement = _placement_from_env(environ, rank_, size_)
    else:
        placement = _placement_from_hostnames(_gather_hostnames(size_, backend_name), rank_)
    return Topology(
        rank_,
        size_,
        *placement,
        master_addr=environ.get("MASTER_ADDR") or None,
        master_port=_int_var(environ, "MASTER_PORT"),
    )


def _gather_hostnames(size_: int, backend_name: str) -> list[str]:
    if size_ == 1:
        return [socket.gethostname()]
    import torch.distributed as dist

    # all_gather_object on an NCCL group runs on the current CUDA device, which is not pinned yet: every
    # rank of a host would use cuda:0 and NCCL refuses that. A short-lived gloo group avoids the GPU.
    group = dist.new_group(backend="gloo") if _device_type(backend_name) == "cuda" else None
    hosts: list[Any] = [None] * size_
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if group is not None:
        dist.destroy_process_group(group)
    return [str(host) for host in hosts]


@dataclasses.dataclass(frozen=True)
class _Context:
    topology: Topology
    backend: str
    # False when the user (or another library) created the default group before init(): shutdown() must
    # then leave it alone.
    owns_group: bool
    device_type: str
    # The CUDA device this rank computes on (None off the GPU): its local rank, or 0 when it was given
    # devices of its own (see collectives.placement).
    device_index: int | None
    # What init() was given, so that an elastic reset re-forms the group alike.
    requested: str | None = None
    timeout: datetime.timedelta = datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)


_context: _Context | None = None
# The world an elastic reset left while no other has formed yet (the new one failed to form: a peer died in
# its rendezvous): the next reinit, or leaving, starts from it.
_left: _Context | None = None

# Rendezvous address -> (how many groups this process has joined there, its store). Each rank keeps its
# store (rank 0 serves it) for the next init() at the same address, as Horovod's gloo-mode tests call
# shutdown() and init() around every test: a store torch made anew there would race the old one, which rank 0
# serves until its group is gone (or longer, while anything still refers to the group). A rank that
# re-initialised first reached the old store, found the old group's keys and hung in the next group's
# creation, with rank 0 starting a new store. The kept store is the same on every rank, and each group's
# keys sit behind a prefix of its own.
_stores: dict[tuple[str, int], tuple[int, Any]] = {}

# (the excepthook torch's init_process_group wrapped, the one it installed): every group torch forms installs
# a hook prefixing each line of an uncaught exception with "[rank<N>]: " around whatever hook is set, so a
# process that forms its group again (an elastic reset, shutdown() and init()) would print "[rank1]: [rank1]:"
# (or the old rank's prefix before the new one). Torch's hook of the last group is taken off first.
_torch_excepthook: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def _require(what: str) -> _Context:
    if _context is None:
        raise NotInitializedError(what)
    return _context


def _gpu_view() -> GpuView:
    """What this process sees: CUDA reads the real environment, whatever ``environ`` init() was given."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    return GpuView.from_env(os.environ, cuda=cuda, nccl=dist.is_nccl_available(), count=count)


def _choose(requested: str | None, topology: Topology) -> BackendChoice:
    choice = choose_backend(
        requested,
        _gpu_view(),
        local_rank=topology.local_rank,
        local_size=topology.local_size,
        host=socket.gethostname(),
    )
    if choice.warning is not None:
        _log.warning("%s", choice.warning)
    return choice


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

    ``backend`` defaults to ``"nccl"`` when every rank on this host can have a GPU of its own (as many visible
    devices as local ranks, or devices given to each rank by ``distrun --gpus-per-rank``), else ``"gloo"``,
    with one warning line when GPUs exist but are too few; an explicit ``"nccl"`` that cannot work raises
    :class:`CollectivesError`. With nccl the current CUDA device is pinned to the rank's own GPU (its local
    rank, or the first of the devices it was given), so ``torch.device("cuda")`` means "my GPU".
    ``timeout`` (seconds or a timedelta) bounds every collective, so a dead peer turns into an error instead
    of a hang. Calling ``init()`` again is a no-op that returns the same topology. A default group created
    earlier by the user is adopted: its rank and size must agree with RANK/WORLD_SIZE where those are set,
    and without LOCAL_RANK and LOCAL_SIZE the local and cross placement come from the ranks' host names.
    """
    global _context
    if _context is not None:
        return _context.topology
    import torch.distributed as dist

    if not dist.is_available():
        raise CollectivesError("this torch build has no torch.distributed support")
    environ_ = os.environ if environ is None else environ
    if dist.is_initialized():
        # Another library got there first: adopt its group, and leave it alone in shutdown().
        chosen = str(dist.get_backend())
        topology = _adopted_topology(environ_, chosen)
        choice = _choose(chosen, topology)
        _pin_device(choice.device_index, topology)
        context = _Context(
            topology,
            chosen,
            owns_group=False,
            device_type=_device_type(chosen),
            device_index=choice.device_index,
        )
    else:
        topology = topology_from_env(environ_)
        with links.owned():
            context = _create_group(topology, _choose(backend, topology), _as_timedelta(timeout))
        context = dataclasses.replace(context, requested=backend, timeout=_as_timedelta(timeout))
    _context = context
    from collectives import collector, registry

    collector.freeze_long_lived(environ_)

    with links.owned():
        registry._setup(context.topology.rank, context.topology.size)
    if context.owns_group:
        leaving.leave_at_exit(_leave)
    topology = context.topology
    _log.info(
        "%s process group: rank %d/%d (local %d/%d, host %d/%d), backend %s",
        "joined" if context.owns_group else "adopted the existing",
        topology.rank,
        topology.size,
        topology.local_rank,
        topology.local_size,
        topology.cross_rank,
        topology.cross_size,
        context.backend,
    )
    return topology


def _create_group(topology: Topology, choice: BackendChoice, timeout: datetime.timedelta) -> _Context:
    import torch
    import torch.distributed as dist

    device_index = choice.device_index
    _pin_device(device_index, topology)
    kwargs: dict[str, object] = {"backend": choice.backend, "timeout": timeout}
    if device_index is not None and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = torch.device("cuda", device_index)
    context = _Context(
        topology,
        choice.backend,
        owns_group=True,
        device_type=_device_type(choice.backend),
        device_index=device_index,
    )
    if topology.size == 1 and (topology.master_addr is None or topology.master_port is None):
        # A plain `python train.py` (or an environment with half an address): a world of one needs no
        # rendezvous, and an in-memory store needs no address or port.
        store = dist.HashStore()  # type: ignore[attr-defined]
        _init_process_group(store=store, rank=0, world_size=1, **kwargs)
        return context
    address = (str(topology.master_addr), int(topology.master_port or 0))
    joined, kept = _stores.get(address, (0, None))
    if kept is None:
        _init_process_group(init_method="env://", rank=topology.rank, world_size=topology.size, **kwargs)
        default_store: Any = dist.distributed_c10d._get_default_store()
        kept = default_store.underlying_store  # inside torch's own "default_pg" prefix
    else:
        # init() again after shutdown(): the same store, the old group's keys left behind their own prefix.
        prefixed = dist.distributed_c10d.PrefixStore(f"collectives/group/{joined}", kept)
        _init_process_group(store=prefixed, rank=topology.rank, world_size=topology.size, **kwargs)
    _stores[address] = (joined + 1, kept)
    return context


def _init_process_group(**kwargs: Any) -> None:
    """torch's init_process_group, with one prefixing excepthook of torch's at a time (see
    ``_torch_excepthook``); a hook someone set over torch's since is left alone."""
    global _torch_excepthook
    import torch.distributed as dist

    if _torch_excepthook is not None and sys.excepthook is _torch_excepthook[1]:
        sys.excepthook = _torch_excepthook[0]
    below = sys.excepthook
    # torch names a group by a counter that only destroying the default group resets, and its peers find
    # each other's keys under that name. A creation that failed (an elastic reset's new world lost a peer
    # before it formed) left the counter one up, so the next world's group here would wait forever for
    # peers that start from 0 (a newcomer's first group). No default group exists now: start from 0.
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0
    dist.init_process_group(**kwargs)
    if sys.excepthook is not below:
        _torch_excepthook = (below, sys.excepthook)


def _device_type(backend_name: str) -> str:
    return "cuda" if is_gpu_backend(backend_name) else "cpu"


def _pin_device(index: int | None, topology: Topology) -> None:
    """Make this rank's GPU the current CUDA device, so that ``torch.device("cuda")`` means "my GPU"."""
    if index is None:
        return
    import torch

    if index != topology.local_rank:
        _log.info(
            "local rank %d computes on cuda:%d, its own device (CUDA_VISIBLE_DEVICES=%s)",
            topology.local_rank,
            index,
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    torch.cuda.set_device(index)


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
    """Index of this host among the hosts with a rank at this local rank (Horovod's cross communicator)."""
    return _require("cross_rank").topology.cross_rank


def cross_size() -> int:
    """Number of hosts with a rank at this local rank (on even hosts: every host), as in Horovod."""
    return _require("cross_size").topology.cross_size


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks (Horovod's ``hvd.is_homogeneous()``)."""
    topology = _require("is_homogeneous").topology
    return topology.local_size * topology.cross_size == topology.size


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
    if context.device_index is not None:
        return torch.device("cuda", context.device_index)
    return torch.device("cpu")


def _barrier() -> None:
    """Block until every rank has reached the barrier (for leaving; the public barrier is in join.py)."""
    context = _require("barrier")
    import torch.distributed as dist

    if context.device_index is not None:
        dist.barrier(device_ids=[context.device_index])
    else:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group, all ranks together; :func:`init` may be called again afterwards.

    Every rank must call it (it waits for the others), as every rank calls :func:`init`. A script that never
    calls it leaves the same way when its interpreter exits (see ``collectives.leaving``).
    """
    _leave(wait_s=None)


def _leave(wait_s: float | None) -> None:
    """Destroy our process group after waiting for every rank to leave too: at most ``wait_s`` (0: not at all,
    None: as long as the group's own timeout)."""
    global _context
    context = _context
    if context is None:
        return
    import torch.distributed as dist

    from collectives import registry

    registry._stop(wait_s)
    if context.owns_group and dist.is_initialized():
        size, rank = context.topology.size, context.topology.rank
        if context.device_index is not None:
            import torch

            torch.cuda.synchronize(context.device_index)  # no kernel of ours still reads what we free
        if size > 1 and wait_s is None:
            _barrier()
        if size > 1 and wait_s != 0:
            leaving.together(rank, size, wait_s)
        _forget_process_sets()
        dist.destroy_process_group()
    _forget_process_sets()
    links.forget()
    _context = None


def reinit(environ: Mapping[str, str]) -> Topology:
    """Leave the process group at once, waiting for no one (some ranks are gone), and join the world that
    ``environ`` describes, in this process: an elastic reset. Process sets other than the global one belong
    to the old world and are dropped. Where the last reinit failed (the new world lost a peer before it
    formed), this one starts from the world left then."""
    global _context, _left
    context = _context if _context is not None else _left
    if context is None:
        raise NotInitializedError("reinit")
    if not context.owns_group:
        raise CollectivesError("an elastic reset needs the process group that collectives.init() created")
    _abandon_group(context)
    _forget_process_sets()
    _context, _left = None, context
    # The old world's stores may be served by a rank that is gone: the new world rendezvouses afresh.
    _stores.clear()
    # The backend the old world ran, not a fresh choice: a world that shrank to one rank per GPU would
    # otherwise move to NCCL under a model left on the CPU.
    topology = init(backend=context.backend, timeout=context.timeout, environ=environ)
    _left = None
    return topology


def abandon() -> None:
    """Leave the world without a barrier, to join none (an elastic rank told to leave the job)."""
    global _context, _left
    context = _context if _context is not None else _left
    if context is not None:
        _abandon_group(context)
    _forget_process_sets()
    _context = _left = None


def _abandon_group(context: _Context) -> None:
    """Destroy the default group without a barrier; NCCL's communicators are aborted first, since a peer that
    is gone would keep their kernels waiting (and destroy would wait for them)."""
    import torch.distributed as dist

    links.forget()
    if not dist.is_initialized():
        return
    if context.device_type == "cuda":
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
            return
    dist.destroy_process_group()


def _forget_process_sets() -> None:
    from collectives import registry

    registry._teardown()
