"""Horovod's broadcast of initial parameters and optimizer state, so that every rank starts from the root's.

Parameters are fused per dtype and device into one broadcast each; optimizer state, a nested structure of
tensors and numbers, travels pickled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from collectives.buckets import fuse, unflatten_into
from collectives.context import _require
from collectives.elastic import joining
from collectives.errors import CollectivesError
from collectives.objects import broadcast_object
from collectives.ops import broadcast_
from collectives.optimizer import DistributedOptimizer

__all__ = ["broadcast_optimizer_state", "broadcast_parameters"]


ParameterSource = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | Iterable[torch.Tensor]


def _tensors_of(params: ParameterSource) -> list[torch.Tensor]:
    if isinstance(params, Mapping):
        return [t for t in params.values() if isinstance(t, torch.Tensor)]
    tensors: list[torch.Tensor] = []
    for item in params:
        tensor = item[1] if isinstance(item, tuple) else item
        if not isinstance(tensor, torch.Tensor):
            raise CollectivesError(f"broadcast_parameters expects tensors, got {type(tensor).__name__}")
        tensors.append(tensor)
    return tensors


def broadcast_parameters(params: ParameterSource, root_rank: int = 0) -> None:
    """Overwrite, in place, every rank's parameters with ``root_rank``'s.

    ``params`` is ``model.state_dict()`` (buffers included), ``model.named_parameters()`` or any iterable of
    tensors. Tensors are fused per dtype and device into one broadcast each.
    """
    _require("broadcast_parameters")
    if joining.skips_top_level_broadcast("hvd.broadcast_parameters"):
        return
    with torch.no_grad():
        for members, flat in fuse(_tensors_of(params)):
            broadcast_(flat, root_rank)
            unflatten_into(flat, members)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


def _initialise_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state (momentum buffers, step counts), as Horovod does before broadcasting.

    One step with zero gradients creates the state; the parameters are restored afterwards (a zero gradient
    still moves them under weight decay). Parameters that train get a zero ``.grad`` if they had none.
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        optimizer.step()
        torch._foreach_copy_([p.data for p in params], saved)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer | DistributedOptimizer, root_rank: int = 0, model: Any = None
) -> None:
    """Make every rank's optimizer state (moments, step counts, hyper-parameters) equal ``root_rank``'s.

    Needed after restoring a checkpoint on one rank only; ``load_state_dict`` moves the state onto each
    rank's own parameter devices. A fresh optimizer's state is created first (see Horovod), so ranks agree
    even before the first step. ``model`` is accepted for Horovod's signature and not needed.
    """
    context = _require("broadcast_optimizer_state")
    if joining.skips_top_level_broadcast("hvd.broadcast_optimizer_state"):
        return
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if not inner.state_dict()["state"]:
        _initialise_state(inner)
    is_root = context.topology.rank == root_rank
    # CPU tensors in the pickle: a CUDA tensor would unpickle onto the root's GPU index on every rank.
    payload = _to_cpu(inner.state_dict()) if is_root else None
    state = broadcast_object(payload, root_rank)
    if not is_root and state is not None:
        inner.load_state_dict(state)
