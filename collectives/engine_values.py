"""The engine's plain values: its settings (Horovod's tuning variables, with Horovod's meanings and defaults)
how an allreduce fuses with others, or rides in the agreement round (:class:`Fusion`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import torch

__all__ = ["Fusion", "Settings"]


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


@dataclasses.dataclass(frozen=True)
class Settings:
    """Horovod's tuning variables, with Horovod's meanings and defaults."""

    fusion_threshold: int = 128 * 1024 * 1024
    cycle_time_s: float = 0.001
    stall_check_s: float = 60.0
    stall_check: bool = True
    gloo_timeout_s: float | None = None

    @classmethod
    def from_env(cls) -> Settings:
        timeout = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "").strip()
        return cls(
            fusion_threshold=int(_env_float("HOROVOD_FUSION_THRESHOLD", 128 * 1024 * 1024)),
            cycle_time_s=_env_float("HOROVOD_CYCLE_TIME", 1.0) / 1000.0,
            stall_check_s=_env_float("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0),
            stall_check=os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0").strip() in ("", "0"),
            gloo_timeout_s=float(timeout) if timeout else None,
        )


class Fusion(NamedTuple):
    """How an allreduce joins others in one buffer: entries with equal ``key`` fuse, ``issue`` reduces a list
    of tensors as one collective and gives one start value per tensor.

    ``reduce``, for a small CPU tensor: it may ride in the agreement round instead (its bytes carried to
    every rank), and ``reduce(tensor, payloads)`` turns every rank's bytes (uint8, in set order) into the
    start value, with no collective of its own. Every rank reduces the same bytes in the same order: the
    same bits everywhere.

    ``reduce_block``, the same for a run of cached operations of one ``key`` whose bytes rode together,
    behind the response cache's bits (``collectives.engine_rounds``): ``reduce_block(tensors, payloads)``
    reduces every rank's bytes of all of them (one block a rank, the tensors' bytes back to back) and gives
    one start value per tensor."""

    key: Hashable
    tensor: torch.Tensor
    issue: Callable[[list[torch.Tensor]], list[Any]]
    nbytes: int  # the tensor's, at hand: ``Tensor.nbytes`` costs a fused burst a C call per operation
    reduce: Callable[[torch.Tensor, list[torch.Tensor]], Any] | None = None
    reduce_block: Callable[[list[torch.Tensor], list[torch.Tensor]], list[Any]] | None = None
