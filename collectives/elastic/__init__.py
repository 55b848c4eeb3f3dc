"""``hvd.elastic``: Horovod's elastic training API on collectives.

    @hvd.elastic.run
    def train(state): ...  # state.commit() every few batches

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)

Under ``distrun --min-np/--max-np`` (or with spare hosts) the surviving ranks keep their process through a
reset: see docs/elastic.md. torch is imported only with ``TorchState`` and ``ElasticSampler``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from collectives.elastic.run import run
from collectives.elastic.state import ObjectState, State
from collectives.errors import HorovodInternalError, HostsUpdatedInterrupt

if TYPE_CHECKING:
    from collectives.elastic.sampler import ElasticSampler
    from collectives.elastic.torch_state import TorchState

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]

_TORCH_NAMES = {"ElasticSampler": "sampler", "TorchState": "torch_state"}


def __getattr__(name: str) -> Any:
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'collectives.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"collectives.elastic.{module}"), name)
