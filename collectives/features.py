"""Horovod's build and feature queries, answered for this library, and the features it cannot offer.

collectives runs on torch.distributed: it coordinates over gloo and moves tensors with the job's backend
(NCCL on GPUs, gloo on CPUs). It never uses MPI, DDL or oneCCL, so those queries answer False. Adasum, the
Horovod timeline and MPI threads have no torch.distributed counterpart; asking for them raises
NotImplementedError naming the alternative.
"""

from __future__ import annotations

__all__ = [
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
]


def mpi_built() -> bool:
    """False: collectives does not use MPI."""
    return False


def mpi_enabled() -> bool:
    """False: collectives does not use MPI."""
    return False


def mpi_threads_supported() -> bool:
    """False, as Horovod answers without MPI: there is no MPI underneath (collectives may be called from any
    thread; the process set's engine issues them)."""
    return False


def gloo_built() -> bool:
    """Whether this torch has gloo (collectives coordinates every collective over it)."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


def gloo_enabled() -> bool:
    """True when gloo is built: it is the control plane of every job (NCCL, if used, carries the data)."""
    return gloo_built()


def nccl_built() -> int:
    """NCCL's version code (e.g. 22105 for 2.21.5), as Horovod reports it, or 0 without NCCL."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()):
        return 0
    major, minor, patch = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    return int(major) * 10000 + int(minor) * 100 + int(patch)


def ddl_built() -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not supported."""
    return False


def cuda_built() -> bool:
    """Whether this torch was built with CUDA."""
    import torch

    return bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]


def rocm_built() -> bool:
    """Whether this torch was built for ROCm."""
    import torch

    return torch.version.hip is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Not available: Horovod's timeline records its own background engine, which collectives lacks."""
    raise NotImplementedError(
        "Horovod's timeline is not available; record collectives with torch.profiler "
        "(torch.profiler.profile(...).export_chrome_trace(path) gives a trace of the same kind)"
    )


def stop_timeline() -> None:
    """Not available: see :func:`start_timeline`."""
    start_timeline("")
