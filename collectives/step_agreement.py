"""Whether the ranks agree on a ``DistributedOptimizer`` step before its buckets move, and the agreement.

An agreed step is an ordered entry of the set's engine, started with the step's first gradient: it holds
nothing, so a blocking collective between ``backward()`` and ``step()`` is agreed after it, and the buckets go
only after the verdict, so a rank that does something else makes every rank raise ``MismatchError`` with no
allreduce in flight. On the CPU, once agreed with nobody joined, the step's buckets go out on the set's
gradient channel in bucket order, each as soon as it is full.

Horovod's response cache for a whole step: on the CPU, a step right after an agreed step of the same
optimizer on the same channel, with nobody joined, goes out with no agreement at all. What decides it is
what every rank knows alike, so all of them skip the agreement or none does. Only the same optimizer's
steps run unagreed, so buckets of two layouts never meet on the channel: gloo aborts the process on a size
mismatch, where an agreement raises. A rank that joins meanwhile takes part in the others' next unagreed
step at once, from ``join()``, with zeros and a mark in the last bucket's extra element
(``collectives.grad_buckets``): the sum is right, every rank sees the mark, and the steps after it are agreed
again, with the joined rank answering from the engine.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from collectives import coordination
from collectives.engine import Ticket
from collectives.engines import engine_for
from collectives.grad_buckets import _Bucket
from collectives.negotiation import Call, Kind
from collectives.registry import _Groups, _teardown_hooks

__all__ = ["StepAgreement"]


class _Stepper(Protocol):
    def _post_joined_step(self, groups: _Groups) -> list[Any]: ...


# Process set id -> the optimizer whose step went last on the set's gradient channel (agreed or not).
_channel_users: dict[int, weakref.ref[Any]] = {}
_teardown_hooks.append(lambda _wait: _channel_users.clear())


def _post_for_join(groups: _Groups) -> list[Any]:
    """The part a rank takes, without stepping, in the next step that is to go out unagreed on ``groups``'
    channel: ``join()`` calls it first; the reductions to wait for."""
    user = _channel_users.get(groups.set_id)
    holder: _Stepper | None = None if user is None else user()
    return [] if holder is None else holder._post_joined_step(groups)


coordination.before_join.append(_post_for_join)


class StepAgreement:
    """One optimizer's agreement, step by step: ``verified_now`` at its gradients, ``done`` or ``forget``
    at its end, ``reset`` before the next."""

    def __init__(self, owner: weakref.ref[Any]) -> None:
        self._owner = owner
        self.verified = False  # this step's buckets may go
        self.direct = False  # ... on the gradient channel, with no agreement of their own
        self.unagreed = False  # this step went out with no agreement
        self.steps_unagreed = 0  # how many did (read by tests and benchmarks)
        self._cached = False  # the next step may go out unagreed
        self._check: Ticket | None = None

    @property
    def started(self) -> bool:
        return self.verified or self._check is not None

    def verified_now(self, groups: _Groups, digest: int, buckets: Sequence[_Bucket], block: bool) -> bool:
        """Whether this step's buckets may go: unagreed, or agreed by every rank (``block``: wait for it)."""
        if self.verified:
            return True
        if self._check is None:
            if groups.size == 1:
                self.verified = True
                return True
            if self._unagreed_next(groups):
                self.verified = self.direct = self.unagreed = True
                return True
            self._check = engine_for(groups).agree(Call(Kind.OPTIMIZER_STEP, digest=digest))
        if not block and not self._check.done():
            return False
        try:
            agreement = self._check.result()
        except BaseException:
            self.reset()
            raise
        self.verified = True
        self.direct = not agreement.joined and groups.control is not None and not buckets[0].buffer.is_cuda
        if agreement.joined:
            # Each joined rank has taken part already in the next step of the optimizer that held the
            # channel, if that step was to go out unagreed: the active ranks take part in it too, with zeros,
            # so that the channel is clear. They all see this agreement and that channel alike.
            for work in _post_for_join(groups):
                work.wait()
        _channel_users[groups.set_id] = self._owner
        return True

    def done(self, buckets: Sequence[_Bucket]) -> None:
        """The step's buckets are reduced: whether the next step may go out unagreed."""
        if self.unagreed:
            self.steps_unagreed += 1
            # A joined rank's zeros came in this step (Average still divides by the whole set, as with a
            # joined rank in an agreed step); from the next step on, the joined ranks answer agreements.
            self._cached = buckets[-1].joined_count() == 0
        else:
            self._cached = self.direct and all(bucket.custom is None for bucket in buckets)

    def forget(self) -> None:
        """The next step is agreed: a failed step, a step taken part in as joined, or a new world."""
        self._cached = False

    def reset(self) -> None:
        self.verified = self.direct = self.unagreed = False
        self._check = None

    def join_now(self, groups: _Groups, buckets: Sequence[_Bucket]) -> list[Any]:
        """For ``join()``: if the other ranks' next step goes out unagreed, take part in it now, with zeros
        and this rank's mark in the last bucket; the reductions to wait for. The step's own buckets are
        left alone: gradients may be views of them."""
        if not self._unagreed_next(groups):
            return []
        self._cached = False
        zeros = [torch.zeros_like(bucket.buffer) for bucket in buckets]
        zeros[-1][-1] = 1
        return [dist.all_reduce(z, op=dist.ReduceOp.SUM, group=groups.control, async_op=True) for z in zeros]

    def _unagreed_next(self, groups: _Groups) -> bool:
        user = _channel_users.get(groups.set_id)
        return self._cached and user is self._owner
