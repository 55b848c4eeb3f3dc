"""Learning-rate scaling for data parallelism and the gradual warm-up of Goyal et al. (2017).

With N ranks each taking a local batch of B, one step consumes N*B samples; the "linear" rule scales the
learning rate by N to keep the per-sample update size, "sqrt" by sqrt(N) (gentler, common with adaptive
optimizers). Jumping straight to the scaled rate destabilises the first epochs, so the warm-up ramps it
linearly from the single-process rate to the scaled one over the first few epochs, per step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

from collectives.errors import CollectivesError

if TYPE_CHECKING:
    import torch

    from collectives.optimizer import DistributedOptimizer

__all__ = ["ScalingRule", "WarmupSchedule", "scale_lr"]

ScalingRule = Literal["linear", "sqrt", "none"]


def scale_lr(base_lr: float, size: int, rule: ScalingRule = "linear") -> float:
    """The learning rate for ``size`` ranks, given the single-process ``base_lr``."""
    if size < 1:
        raise CollectivesError(f"size must be >= 1, got {size}")
    if rule == "linear":
        return base_lr * size
    if rule == "sqrt":
        return base_lr * math.sqrt(size)
    if rule == "none":
        return base_lr
    raise CollectivesError(f"unknown learning-rate scaling rule {rule!r}; use 'linear', 'sqrt' or 'none'")


@dataclasses.dataclass(frozen=True)
class WarmupSchedule:
    """Ramp linearly from ``base_lr`` to ``target_lr`` over ``warmup_epochs``, then hold ``target_lr``.

    The ramp advances every step (``steps_per_epoch`` of them per epoch), as in Goyal et al.
    """

    base_lr: float
    target_lr: float
    warmup_epochs: float
    steps_per_epoch: int = 1

    def __post_init__(self) -> None:
        if self.warmup_epochs < 0:
            raise CollectivesError(f"warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if self.steps_per_epoch < 1:
            raise CollectivesError(f"steps_per_epoch must be >= 1, got {self.steps_per_epoch}")
        if self.target_lr <= 0:
            raise CollectivesError(f"target_lr must be positive, got {self.target_lr}")

    @classmethod
    def for_size(
        cls,
        base_lr: float,
        size: int,
        warmup_epochs: float = 5.0,
        steps_per_epoch: int = 1,
        rule: ScalingRule = "linear",
    ) -> WarmupSchedule:
        """Warm up from ``base_lr`` to ``scale_lr(base_lr, size, rule)``."""
        return cls(base_lr, scale_lr(base_lr, size, rule), warmup_epochs, steps_per_epoch)

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epochs * self.steps_per_epoch)

    def lr_at_step(self, step: int) -> float:
        """Learning rate for the ``step``-th optimizer step (0-based)."""
        if step >= self.warmup_steps:
            return self.target_lr
        return self.base_lr + (self.target_lr - self.base_lr) * step / self.warmup_steps

    def lr_at_epoch(self, epoch: float) -> float:
        """Learning rate at a (fractional) epoch."""
        return self.lr_at_step(math.floor(epoch * self.steps_per_epoch))

    def scheduler(
        self, optimizer: torch.optim.Optimizer | DistributedOptimizer
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """A per-step LambdaLR applying this schedule; call its ``step()`` after every optimizer step.

        Sets every parameter group's learning rate to ``target_lr`` (the scheduler multiplies it down).
        """
        import torch

        inner = getattr(optimizer, "optimizer", optimizer)
        if not isinstance(inner, torch.optim.Optimizer):
            raise CollectivesError(f"expected a torch optimizer, got {type(optimizer).__name__}")
        for group in inner.param_groups:
            group["lr"] = self.target_lr
            group["initial_lr"] = self.target_lr
        return torch.optim.lr_scheduler.LambdaLR(inner, lambda step: self.lr_at_step(step) / self.target_lr)
