"""``TorchState(model, optimizer, **attributes)``: a model's and an optimizer's state (and an ElasticSampler's
progress) committed as copies in memory, restored after a failure, synced from rank 0 after a reset."""

from __future__ import annotations

import copy
from typing import Any

import torch

from collectives.elastic.sampler import ElasticSampler
from collectives.elastic.state import ObjectState

__all__ = ["TorchState"]


class _Handler:
    """One stateful torch object: a saved copy of its state dict, and how to sync it."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        raise NotImplementedError

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _Model(_Handler):
    def sync(self) -> None:
        from collectives.broadcast_state import broadcast_parameters

        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _Optimizer(_Handler):
    def sync(self) -> None:
        from collectives.broadcast_state import broadcast_optimizer_state

        broadcast_optimizer_state(self.value, root_rank=0)


class _Sampler(_Handler):
    def sync(self) -> None:
        from collectives.objects import broadcast_object

        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


def _handler(value: Any) -> _Handler | None:
    for kind, handler in (
        (torch.nn.Module, _Model),
        (torch.optim.Optimizer, _Optimizer),
        (ElasticSampler, _Sampler),
    ):
        if isinstance(value, kind):
            return handler(value)
    # collectives' DistributedOptimizer wraps a torch optimizer without being one.
    if hasattr(value, "state_dict") and hasattr(value, "param_groups"):
        return _Optimizer(value)
    return None


class TorchState(ObjectState):
    """Models, optimizers and ElasticSamplers among the attributes get their own save/restore/sync; every
    other attribute is a picklable object (epoch, batch, ...)."""

    _handlers: dict[str, _Handler]

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            found = _handler(value)
            if found is None:
                plain[name] = value
            else:
                handlers[name] = found
        object.__setattr__(self, "_handlers", handlers)
        for name, found in handlers.items():
            object.__setattr__(self, name, found.value)
        super().__init__(**plain)

    def save(self) -> None:
        for found in self._handlers.values():
            found.save()
        super().save()

    def restore(self) -> None:
        for found in self._handlers.values():
            found.restore()
        super().restore()

    def sync(self) -> None:
        for found in self._handlers.values():
            found.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
