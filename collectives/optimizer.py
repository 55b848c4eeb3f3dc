"""Horovod's DistributedOptimizer on torch.distributed, plus broadcast of initial parameters and state.

Gradients are averaged in buckets of about ``bucket_cap_mb``. A post-accumulate-grad hook on every parameter
counts finished gradients; when all of a bucket's gradients are final, its allreduce starts asynchronously
while autograd keeps computing earlier layers, so communication overlaps compute. ``step()`` waits for the
buckets and then runs the wrapped optimizer. Buckets are launched strictly in bucket order on every rank, so
ranks can never pair up different buckets even if their autograd orders differ.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.compression import Compression, Compressor
from collectives.context import _require
from collectives.errors import CollectivesError, GradientSyncError
from collectives.ops import broadcast_, broadcast_object
from collectives.reduce_op import ReduceOp

__all__ = ["DistributedOptimizer", "broadcast_optimizer_state", "broadcast_parameters"]

_log = logging.getLogger(__name__)

DEFAULT_BUCKET_CAP_MB = 25.0


class _Bucket:
    """A run of same-dtype, same-device parameters reduced as one flat buffer."""

    def __init__(self, index: int, params: list[torch.nn.Parameter]) -> None:
        self.index = index
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.ready = 0
        # Reused across steps so the allocator does not churn on every backward.
        self.buffer = torch.empty(self.numel, dtype=params[0].dtype, device=params[0].device)
        self.work: dist.Work | None = None
        self.wire: torch.Tensor | None = None

    @property
    def complete(self) -> bool:
        return self.ready == len(self.params)


def _build_buckets(params: Sequence[torch.nn.Parameter], cap_bytes: int) -> list[_Bucket]:
    """Split ``params`` into buckets in reverse order, as gradients arrive roughly last layer first."""
    buckets: list[_Bucket] = []
    open_runs: dict[tuple[torch.dtype, torch.device], tuple[list[torch.nn.Parameter], int]] = {}
    order: list[list[torch.nn.Parameter]] = []
    for param in reversed(params):
        key = (param.dtype, param.device)
        run, used = open_runs.get(key, ([], 0))
        if not run:
            order.append(run)
        nbytes = param.numel() * param.element_size()
        if run and used + nbytes > cap_bytes:
            run = []
            order.append(run)
            used = 0
        run.append(param)
        open_runs[key] = (run, used + nbytes)
    for index, run in enumerate(order):
        buckets.append(_Bucket(index, run))
    return buckets


class DistributedOptimizer:
    """Wrap a torch optimizer so that ``step()`` applies gradients averaged over all ranks.

    ``compression`` casts the buckets for the wire (``Compression.fp16``/``bf16``). With
    ``backward_passes_per_step=k`` gradients are accumulated locally over k backward passes and reduced once;
    with ``op=Average`` they are averaged over the passes as well as the ranks, so k micro-batches with a mean
    loss give the same step as one batch k times as large (Horovod sums over the passes instead; use
    ``op=Sum`` for sums over both). ``zero_grad``, ``state_dict``, ``load_state_dict`` and ``param_groups``
    are the wrapped optimizer's, so LR schedulers can be attached to ``.optimizer``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        *,
        compression: Compressor = Compression.none,
        backward_passes_per_step: int = 1,
        op: ReduceOp = ReduceOp.AVERAGE,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    ) -> None:
        context = _require("DistributedOptimizer")
        if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise CollectivesError(f"DistributedOptimizer supports op=Average or op=Sum, got {op}")
        if backward_passes_per_step < 1:
            raise CollectivesError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if bucket_cap_mb <= 0:
            raise CollectivesError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self._optimizer = optimizer
        self._compression = compression
        self._passes = backward_passes_per_step
        self._op = op
        self._world = context.topology.size
        self._scale = 1.0 / (self._world * self._passes) if op is ReduceOp.AVERAGE else 1.0
        self._names = self._parameter_names(optimizer, named_parameters)
        self._name_by_id = {id(p): name for p, name in self._names.items()}
        params = [p for p in self._names if p.requires_grad]
        self._buckets = _build_buckets(params, int(bucket_cap_mb * 1024 * 1024))
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._pass_counts = {id(p): 0 for p in params}
        self._next_launch = 0
        self._synchronized = False
        self._skip_sync = False
        self._hook_handles = [
            p.register_post_accumulate_grad_hook(self._on_grad_ready)  # type: ignore[no-untyped-call]
            for p in params
        ]
        _log.debug(
            "DistributedOptimizer: %d parameters in %d buckets, compression=%s, passes=%d",
            len(params),
            len(self._buckets),
            compression.name,
            self._passes,
        )

    @staticmethod
    def _parameter_names(
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
    ) -> dict[torch.nn.Parameter, str]:
        in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
        if named_parameters is None:
            return {
                p: f"param_groups[{g}][{i}]"
                for g, group in enumerate(optimizer.param_groups)
                for i, p in enumerate(group["params"])
            }
        named = list(named_parameters)
        names = [name for name, _ in named]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise CollectivesError(f"named_parameters has duplicate names: {duplicates}")
        by_param = {p: name for name, p in named}
        missing = [i for i, p in enumerate(in_optimizer) if p not in by_param]
        if missing:
            raise CollectivesError(
                f"{len(missing)} parameter(s) of the optimizer are missing from named_parameters; pass "
                "model.named_parameters() for the same model the optimizer was built from"
            )
        # Order and membership follow the optimizer: those are the gradients step() consumes.
        return {p: by_param[p] for p in in_optimizer}

    # The hook runs on autograd's thread once a parameter's .grad is final for this backward pass.
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        key = id(param)
        count = self._pass_counts[key] + 1
        if count > self._passes:
            raise GradientSyncError(
                f"gradient of {self._name_by_id.get(key, 'a parameter')!r} was computed {count} times before "
                f"step(), but backward_passes_per_step={self._passes}; call step() (or synchronize()) after "
                f"every {self._passes} backward pass(es)"
            )
        self._pass_counts[key] = count
        if count == self._passes:
            bucket = self._bucket_of[key]
            bucket.ready += 1
            if bucket.complete:
                self._launch_in_order()

    def _launch_in_order(self) -> None:
        while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].complete:
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> None:
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
            for p in bucket.params
        ]
        torch.cat(grads, out=bucket.buffer)
        wire: torch.Tensor
        if self._compression.wire_dtype is not None:
            # Scale before the cast, as torch's fp16_compress_hook does: the sum then cannot overflow fp16.
            if self._scale != 1.0:
                bucket.buffer.mul_(self._scale)
            wire = self._compression.compress(bucket.buffer)
        else:
            wire = bucket.buffer
        bucket.wire = wire
        bucket.work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, async_op=True)

    def synchronize(self) -> None:
        """Wait for every bucket's allreduce and write the averaged gradients into ``.grad``.

        Call it yourself before modifying gradients (e.g. clipping), then call ``step()`` inside
        ``with optimizer.skip_synchronize():``.
        """
        for bucket in self._buckets[self._next_launch :]:
            # Parameters that got no gradient on this rank still take part, with zeros, because the other
            # ranks' buckets contain them.
            bucket.ready = len(bucket.params)
        self._launch_in_order()
        compressed = self._compression.wire_dtype is not None
        for bucket in self._buckets:
            if bucket.work is None or bucket.wire is None:
                raise GradientSyncError(f"bucket {bucket.index} was never launched")
            bucket.work.wait()
            flat = self._compression.decompress(bucket.wire, bucket.buffer.dtype)
            post_scale = 1.0 if compressed else self._scale
            offset = 0
            for p in bucket.params:
                count = p.numel()
                reduced = flat[offset : offset + count].view_as(p)
                offset += count
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                if post_scale == 1.0:
                    p.grad.copy_(reduced)
                else:
                    torch.mul(reduced, post_scale, out=p.grad)
            bucket.work = None
            bucket.wire = None
            bucket.ready = 0
        for key in self._pass_counts:
            self._pass_counts[key] = 0
        self._next_launch = 0
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this block ``step()`` does not synchronize again (``synchronize()`` was called already)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Average the gradients across ranks (unless synchronized already); then step the optimizer."""
        if closure is not None:
            raise GradientSyncError(
                "DistributedOptimizer.step() does not take a closure: a closure's backward pass would start "
                "allreduces that nothing waits for"
            )
        if not self._skip_sync:
            self.synchronize()
        elif not self._synchronized:
            raise GradientSyncError("step() inside skip_synchronize() needs a synchronize() call first")
        self._synchronized = False
        return self._optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (the wrapped optimizer's ``zero_grad``)."""
        if any(self._pass_counts.values()):
            raise GradientSyncError(
                "zero_grad() was called after backward() but before step(): allreduces of those gradients "
                "are in flight; call step() (or synchronize()) first"
            )
        self._optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer (attach LR schedulers to it)."""
        return self._optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._optimizer.param_groups

    @property
    def state(self) -> Any:
        return self._optimizer.state

    @property
    def backward_passes_per_step(self) -> int:
        return self._passes

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def remove_hooks(self) -> None:
        """Detach the gradient hooks, leaving the parameters as they were before wrapping."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def __repr__(self) -> str:
        return (
            f"DistributedOptimizer({self._optimizer.__class__.__name__}, buckets={len(self._buckets)}, "
            f"compression={self._compression.name}, backward_passes_per_step={self._passes}, "
            f"op={self._op.name})"
        )


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
    tensors = _tensors_of(params)
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    with torch.no_grad():
        for members in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            broadcast_(flat, root_rank)
            offset = 0
            for tensor in members:
                count = tensor.numel()
                tensor.copy_(flat[offset : offset + count].view_as(tensor))
                offset += count


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer | DistributedOptimizer, root_rank: int = 0
) -> None:
    """Make every rank's optimizer state (moments, step counts, hyper-parameters) equal ``root_rank``'s.

    Needed after restoring a checkpoint on one rank only; ``load_state_dict`` moves the state onto each
    rank's own parameter devices.
    """
    context = _require("broadcast_optimizer_state")
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    is_root = context.topology.rank == root_rank
    # CPU tensors in the pickle: a CUDA tensor would unpickle onto the root's GPU index on every rank.
    payload = _to_cpu(inner.state_dict()) if is_root else None
    state = broadcast_object(payload, root_rank)
    if not is_root and state is not None:
        inner.load_state_dict(state)
