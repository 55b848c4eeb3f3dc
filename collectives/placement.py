"""Which backend and which GPU a rank uses (pure: what torch reports comes in as a :class:`GpuView`).

NCCL needs a GPU of its own for every rank: two ranks on one device die inside NCCL with "Duplicate GPU
detected". So the default backend is nccl only when every rank on the host can have its own GPU, and an
explicit ``backend="nccl"`` that cannot work is refused with one clear line before NCCL runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from collectives.errors import CollectivesError

__all__ = ["OWN_GPUS_VAR", "BackendChoice", "GpuView", "choose_backend", "is_gpu_backend"]

# Set by `distrun --gpus-per-rank N` next to each rank's own CUDA_VISIBLE_DEVICES: the devices a rank sees are
# its own, so two ranks that each see one device do not share it.
OWN_GPUS_VAR = "DISTRUN_OWN_GPUS"


@dataclasses.dataclass(frozen=True)
class GpuView:
    """What one rank can tell about its GPUs before it joins the group."""

    cuda: bool
    nccl: bool
    # Devices this process sees, after CUDA_VISIBLE_DEVICES.
    count: int
    # CUDA_VISIBLE_DEVICES as set, None when unset.
    visible_devices: str | None = None
    # The launcher gave this rank devices of its own (OWN_GPUS_VAR).
    own: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, cuda: bool, nccl: bool, count: int) -> GpuView:
        own = (environ.get(OWN_GPUS_VAR) or "").strip() not in ("", "0")
        return cls(cuda, nccl, count if cuda else 0, environ.get("CUDA_VISIBLE_DEVICES"), own)


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """The backend to create, the CUDA device index to pin (None off the GPU), and a warning to log."""

    backend: str
    device_index: int | None
    warning: str | None = None


def is_gpu_backend(name: str) -> bool:
    return "nccl" in name.lower()


def _own_device(view: GpuView, local_rank: int, local_size: int) -> int | None:
    """The index of a device that is this rank's alone, or None when the host's ranks must share."""
    if view.count == 0:
        return None
    if view.own:
        return 0  # CUDA_VISIBLE_DEVICES lists exactly this rank's devices, renumbered from 0
    if view.count >= local_size:
        return local_rank
    return None


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _shown_devices(view: GpuView) -> str:
    gpus = _count(view.count, "GPU")
    if view.visible_devices is None:
        return gpus
    return f"{gpus} (CUDA_VISIBLE_DEVICES={view.visible_devices!r})"


def choose_backend(
    requested: str | None, view: GpuView, *, local_rank: int, local_size: int, host: str
) -> BackendChoice:
    """Pick the backend and device for one rank; raise CollectivesError for an explicit nccl that cannot work.

    With no request: nccl when every one of the host's ``local_size`` ranks can have its own GPU, else gloo
    (with a warning, from local rank 0 only, when GPUs exist but are too few). A user who gave each rank its
    own device through CUDA_VISIBLE_DEVICES without distrun is trusted only with an explicit nccl request.
    """
    if requested is not None and not is_gpu_backend(requested):
        return BackendChoice(requested, None)
    index = _own_device(view, local_rank, local_size)
    ranks = _count(local_size, "rank")
    at_most = f"start at most {_count(view.count, 'rank')} per host"
    if requested is None:
        if not (view.cuda and view.nccl and view.count > 0):
            return BackendChoice("gloo", None)
        if index is not None:
            return BackendChoice("nccl", index)
        warning = (
            f"collectives: host {host} runs {ranks} but this rank sees {_shown_devices(view)}, so NCCL "
            f"cannot give each rank its own GPU: using gloo on the CPU. For nccl, {at_most}, or give each "
            "rank its own GPU (distrun --gpus-per-rank 1)"
        )
        return BackendChoice("gloo", None, warning if local_rank == 0 else None)
    if not view.nccl or view.count == 0:
        what = "this torch build has no NCCL" if view.cuda and not view.nccl else "it sees no CUDA device"
        raise CollectivesError(
            f"backend={requested!r} cannot work on host {host}: {what} "
            f"({_shown_devices(view)}); use backend='gloo' or leave the backend to collectives.init()"
        )
    if index is None and view.count == 1 and view.visible_devices is not None:
        index = 0  # asked for nccl with one device in CUDA_VISIBLE_DEVICES: trusted to be this rank's own
    if index is None:
        raise CollectivesError(
            f"backend={requested!r} cannot work on host {host}: it runs {ranks} but this rank (local rank "
            f"{local_rank}) sees {_shown_devices(view)}, and NCCL needs a GPU per rank; {at_most}, "
            "use distrun --gpus-per-rank 1, or backend='gloo'"
        )
    return BackendChoice(requested, index)
