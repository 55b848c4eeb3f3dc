"""Horovod's DistributedOptimizer on torch.distributed (its gradient buckets: ``collectives.grad_buckets``).

Gradients are averaged in buckets laid out as DDP lays them out: in reverse registration order for the first
step, then in the order rank 0's gradients became ready in that step (DDP's bucket rebuild), each bucket
closing once it holds ``bucket_cap_mb`` (by default a first bucket of 1 MB, then 25 MB each, DDP's
defaults). A post-accumulate-grad hook on every parameter copies its final gradient, already divided for
the average and cast for the wire, into its slot of the bucket's persistent buffer; the hook that fills a
bucket starts its allreduce asynchronously while autograd keeps computing earlier layers, so communication
overlaps compute and no pass over a whole bucket sits between the last gradient and the launch. ``step()``
waits for the buckets, copies the results into ``.grad`` and runs the wrapped optimizer. On the CPU, once
the step is agreed, the buckets go out in bucket order on the set's gradient channel (a gloo group of their
own), with no agreement per bucket, so no collective of the engine's comes between them and one called
between ``backward()`` and ``step()`` waits for no bucket; elsewhere, or with a rank joined, each bucket is
submitted to the set's engine under its own name, as Horovod's hooks submit each gradient.

Without compression the gradients become views of the bucket buffers after the first step (DDP's
``gradient_as_bucket_view``): the reduced bucket is the gradient, with no copy back, and a backward pass into
an existing gradient accumulates straight into its slot. The ranks agree, in the engine's
ordered sequence and before the first bucket moves, that they are all stepping an optimizer of the same
layout, so a rank that does something else makes both raise instead of hang; a rank that has called
``join()`` takes part with zeros. They agree at every step on the GPU; on the CPU only where the last step
on the channel was not this optimizer's, agreed with nobody joined (Horovod's response cache for a whole
step; see ``collectives.step_agreement``).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from collectives import coordination
from collectives.buckets import assign_buckets
from collectives.compression import Compression, Compressor
from collectives.context import _require
from collectives.engine import Ticket
from collectives.engines import engine_for
from collectives.errors import ArgumentError, CollectivesError, GradientSyncError, HorovodInternalError
from collectives.grad_buckets import _Bucket, _grad_hook, _remove_handles, _views
from collectives.negotiation import Call, Kind
from collectives.objects import broadcast_object
from collectives.ops import sparse_allreduce_async
from collectives.optimizer_args import fixed_groups, parameter_names
from collectives.process_sets import ProcessSet, global_process_set, groups_of
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups
from collectives.step_agreement import StepAgreement

__all__ = ["DistributedOptimizer"]

_log = logging.getLogger(__name__)

MB = 1024 * 1024
DEFAULT_BUCKET_CAP_BYTES = 25 * MB
# DDP's first bucket when bucket_cap_mb is not given (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES): the
# last layers' gradients, which are ready first, start communicating without waiting for 25 MB of others.
DEFAULT_FIRST_BUCKET_BYTES = 1 * MB

# Parameter -> weakref to the DistributedOptimizer whose hooks it carries. Weak on both sides: it must keep
# neither a model nor an optimizer alive; it exists so that wrapping the same parameters again can retire the
# old hooks. Keyed by identity: tensors compare elementwise, so weakref.WeakKeyDictionary cannot hold them.
_OWNERS = WeakIdKeyDictionary()

# The ticket of a bucket issued on the gradient channel: settled at once, its work is the bucket's own.
_LAUNCHED = Ticket()
_LAUNCHED._settle(None, None)

# Layout digest -> how many optimizers of that layout this process has built: part of the buckets' names.
_instances: dict[int, int] = {}


def _owner_ref(param: torch.Tensor) -> weakref.ref[DistributedOptimizer] | None:
    # torch.utils.weak is not annotated; this function gives its one lookup a type.
    ref: weakref.ref[DistributedOptimizer] | None = _OWNERS.get(param)  # type: ignore[no-untyped-call]
    return ref


class DistributedOptimizer:
    """Wrap a torch optimizer so that ``step()`` applies gradients averaged over all ranks (Horovod's).

    The arguments are Horovod's, in Horovod's order. ``compression`` casts the buckets for the wire
    (``Compression.fp16``/``bf16``, or a compressor of your own with Horovod's interface). With
    ``backward_passes_per_step=k`` gradients are accumulated locally over k backward passes (summed, as
    autograd sums them into ``.grad``) and reduced once, when the k-th pass is done; as in Horovod,
    ``op=Average`` then averages over the ranks only, so the step sees k times the gradient of one mean-loss
    micro-batch (divide the loss by k for the mean over the passes). ``synchronize()`` or ``step()`` before
    the k-th pass reduces what has accumulated so far. ``gradient_predivide_factor`` is accepted for
    Average: the division by the world size already happens before the sum, which is what the factor is for.
    ``groups`` (a number of groups, or lists of parameters) fixes the fusion buckets instead of DDP's layout;
    ``num_groups`` is Horovod's older spelling of a number. Sparse gradients (``nn.Embedding(sparse=True)``)
    are gathered as sparse tensors, or reduced densely with ``sparse_as_dense=True``. ``process_set``
    restricts the averaging to a process set. ``zero_grad``, ``state_dict``, ``load_state_dict`` and
    ``param_groups`` are the wrapped optimizer's, so LR schedulers can be attached to ``.optimizer``.
    """

    def __init__(  # noqa: PLR0917 (Horovod's signature)
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        compression: Compressor | Any = Compression.none,
        backward_passes_per_step: int = 1,
        op: ReduceOp = ReduceOp.AVERAGE,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: int | Sequence[Sequence[torch.nn.Parameter]] | None = None,
        sparse_as_dense: bool = False,
        process_set: ProcessSet = global_process_set,
        *,
        bucket_cap_mb: float | None = None,
    ) -> None:
        names = parameter_names(optimizer, named_parameters)  # Horovod checks them before it needs init()
        _require("DistributedOptimizer")
        registered = process_set._groups()
        if registered is not None and registered.index is None:
            # Not a member of the set: as in Horovod, this rank's optimizer steps on its own gradients.
            me = _require("DistributedOptimizer").topology.rank
            set_groups = _Groups(-1, (me,), index=0)
            self._local = True
        else:
            set_groups = groups_of(process_set, "DistributedOptimizer")
        if op is ReduceOp.ADASUM:
            raise NotImplementedError(
                "Adasum needs Horovod's own MPI/NCCL implementation, which torch.distributed lacks; "
                "use op=Average"
            )
        if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise CollectivesError(f"DistributedOptimizer supports op=Average or op=Sum, got {op}")
        if gradient_predivide_factor != 1.0 and op is not ReduceOp.AVERAGE:
            raise ArgumentError("gradient_predivide_factor not supported with op != Average")
        if backward_passes_per_step < 1:
            raise CollectivesError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if bucket_cap_mb is not None and bucket_cap_mb <= 0:
            raise CollectivesError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self._optimizer = optimizer
        self._compression = compression
        self._passes = backward_passes_per_step
        self._op = op
        self._sparse_as_dense = sparse_as_dense
        self._process_set_arg = process_set
        self._local_groups = set_groups if self._local else None
        # Horovod's Average divides by the ranks alone: the passes are summed, as autograd sums them.
        self._divisor = set_groups.size if op is ReduceOp.AVERAGE else 1
        self._names = names
        # Horovod's attribute of the same name: parameter -> name.
        self._parameter_names = self._names
        self._name_by_id = {id(p): name for p, name in self._names.items()}
        params = [p for p in self._names if p.requires_grad]
        self._caps = (
            (DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES)
            if bucket_cap_mb is None
            else (bucket_cap_mb * MB, bucket_cap_mb * MB)
        )
        self._buckets: list[_Bucket] = []
        self._slot_of: dict[int, tuple[_Bucket, int]] = {}
        self._index_of = {id(p): index for index, p in enumerate(params)}
        fixed = fixed_groups(params, groups if groups is not None else (num_groups or None))
        self._fixed = fixed
        if fixed is None:
            # For the first step, reverse registration order: gradients become ready roughly last layer
            # first.
            self._lay_out(params[::-1])
        else:
            self._lay_out_runs(fixed)
        # This rank's parameters in the order their gradients became final in the first step; None once the
        # buckets have been laid out again from rank 0's order (never with fixed groups).
        self._ready_order: list[int] | None = [] if fixed is None else None
        self._pass_counts = {id(p): 0 for p in params}
        self._next_launch = 0
        # True from synchronize() until the next gradient arrives: step() must not reduce the same
        # gradients twice (that would divide by the world size twice, or multiply by it under op=Sum).
        self._synchronized = False
        self._params = params
        # Sparse gradients of this step, by parameter index: reduced apart from the buckets.
        self._sparse: dict[int, torch.Tensor] = {}
        self._sparse_params: set[int] = set()
        # Parameters whose sparse gradients travel dense (sparse_as_dense): sparse again after the step's
        # reduction, for optimizers such as SparseAdam that take nothing else.
        self._densified: set[int] = set()
        # The engine's tickets of this step's launched buckets, in bucket order.
        self._launches: list[Ticket] = []
        # Names this optimizer's buckets on every rank: ranks build their optimizers in the same order.
        layout = self._digest_of(set_groups.ranks, 0)
        _instances[layout] = self._instance = _instances.get(layout, 0) + 1
        self._digest = self._digest_of(set_groups.ranks, self._instance)
        coordination.joinable_optimizers[self._digest] = self
        self._retire_previous_owners(params)
        self._ref = weakref.ref(self)
        self._agreement = StepAgreement(self._ref)
        for p in params:
            _OWNERS[p] = self._ref
        hook = _grad_hook(self._ref)
        handles = [p.register_post_accumulate_grad_hook(hook) for p in params]  # type: ignore[no-untyped-call]
        # Unhooks the parameters when this optimizer is garbage-collected without remove_hooks().
        self._unhook = weakref.finalize(self, _remove_handles, handles)
        self._unhook.atexit = False
        _log.debug(
            "DistributedOptimizer: %d parameters in %d buckets, compression=%s, passes=%d",
            len(params),
            len(self._buckets),
            getattr(compression, "name", type(compression).__name__),
            self._passes,
        )

    def _lay_out(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Cut ``params``, in the order their gradients are expected, into buckets."""
        cap, first_cap = self._caps
        self._lay_out_runs(assign_buckets(params, cap, first_cap))

    def _lay_out_runs(self, runs: Sequence[list[torch.nn.Parameter]]) -> None:
        self._buckets = [
            _Bucket(index, run, self._compression, self._divisor) for index, run in enumerate(runs)
        ]
        self._slot_of = {
            id(p): (bucket, position) for bucket in self._buckets for position, p in enumerate(bucket.params)
        }

    def _digest_of(self, ranks: Sequence[int], instance: int) -> int:
        """The layout's digest, and with ``instance`` this optimizer's own: two optimizers of one layout
        (say two equal heads) are told apart by the order in which they were built."""
        # The device type too: whether the buckets may take the gradient channel depends on it (see _launch).
        shapes = [(str(p.dtype), p.device.type, tuple(p.shape)) for p in self._params]
        return zlib.crc32(repr((list(ranks), self._passes, self._op.name, shapes, instance)).encode())

    def _rejoin(self) -> None:
        """After an elastic reset (collectives.elastic): the divisor, the agreement's digest and the learned
        bucket order belong to the old world; newcomers learn the order with everyone at the first step."""
        if self._local:
            return
        groups = self._groups
        coordination.joinable_optimizers.pop(self._digest, None)
        self._divisor = groups.size if self._op is ReduceOp.AVERAGE else 1
        # The buckets' names keep their instance number: a newcomer's optimizer, made in the new world, has
        # the same place in its script's order as a survivor's.
        self._digest = self._digest_of(groups.ranks, self._instance)
        coordination.joinable_optimizers[self._digest] = self
        self._agreement.forget()
        if self._ready_order is None and self._fixed is None:
            self._lay_out(self._params[::-1])
            self._ready_order = []
        self._reset()

    def _rebuild_buckets(self, ready_order: list[int]) -> None:
        """After the first step, lay the buckets out in the order gradients really became ready, as DDP does.

        Registration order is only a guess: a model may register its head before its body, or use a module
        in another place than it defines it, and a bucket whose parameter comes late holds back every bucket
        after it. All ranks take the first rank's order so that their buckets stay the same; parameters that
        it saw no gradient for go last, where they hold back nothing.
        """
        root = self._groups.ranks[0]
        order: list[int] = (
            ready_order
            if self._local
            else broadcast_object(ready_order, root, process_set=self._process_set())
        )
        seen = set(order)
        rest = [index for index in reversed(range(len(self._params))) if index not in seen]
        self._lay_out([self._params[index] for index in order + rest])
        _log.debug("DistributedOptimizer: buckets rebuilt in gradient order: %d buckets", len(self._buckets))

    @property
    def _groups(self) -> _Groups:
        """The process set's groups as registered now (a rank outside the set has its own, of one)."""
        if self._local_groups is not None:
            return self._local_groups
        return groups_of(self._process_set_arg, "DistributedOptimizer")

    def _process_set(self) -> ProcessSet:
        return self._process_set_arg

    @staticmethod
    def _retire_previous_owners(params: Sequence[torch.nn.Parameter]) -> None:
        previous = {
            owner for p in params if (ref := _owner_ref(p)) is not None and (owner := ref()) is not None
        }
        for owner in previous:
            # Two sets of hooks on one parameter would count each gradient twice; the newest wrapper wins.
            _log.info("parameters wrapped by a new DistributedOptimizer: removing the hooks of %r", owner)
            owner.remove_hooks()

    # The hook runs on autograd's thread once a parameter's .grad is final for this backward pass.
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        self._synchronized = False
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
            if self._ready_order is not None:
                self._ready_order.append(self._index_of[key])
            bucket, position = self._slot_of[key]
            self._fill(bucket, position)
            if not self._agreement.started:
                # The step's agreement starts with its first gradient, so it is in by the time a bucket is
                # full; every later gradient looks whether it has come.
                self._verified_now(block=False)
            if not bucket.missing or not self._agreement.verified:
                self._launch_in_order()

    def _fill(self, bucket: _Bucket, position: int) -> None:
        param = bucket.params[position]
        grad = param.grad
        if grad is not None and grad.layout != torch.strided:
            if self._sparse_as_dense:
                grad = grad.to_dense()
                self._densified.add(self._index_of[id(param)])
            else:
                # Gathered apart in synchronize(); the bucket carries zeros in its place.
                index = self._index_of[id(param)]
                self._sparse[index] = grad
                self._sparse_params.add(index)
                grad = None
        bucket.fill(position, grad)

    _local = False

    def _verified_now(self, block: bool) -> bool:
        return self._agreement.verified_now(self._groups, self._digest, self._buckets, block)

    def _post_joined_step(self, groups: _Groups) -> list[Any]:
        """For ``join()`` (see ``StepAgreement.join_now``)."""
        return self._agreement.join_now(groups, self._buckets)

    def _launch_in_order(self, block: bool = False) -> None:
        while self._next_launch < len(self._buckets) and not self._buckets[self._next_launch].missing:
            if not self._verified_now(block):
                return
            self._launches.append(self._launch(self._buckets[self._next_launch]))
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> Ticket:
        """Submit ``bucket``'s allreduce to the engine under its own name, as Horovod's hooks submit each
        gradient: the engine issues it once every rank has submitted it, in whatever order the ranks'
        other collectives come, so no bucket waits on ``step()`` while another collective waits on it."""
        groups = self._groups
        local = self._local
        if local or groups.size == 1:
            ticket = Ticket()
            bucket.launch(groups.data, local)
            ticket._settle(None, None)
            return ticket
        if self._agreement.direct:
            # The channel carries only these steps' buckets, in bucket order on every rank.
            bucket.launch(groups.control, local)
            return _LAUNCHED
        call = Call(
            Kind.ALLREDUCE,
            f"DistributedOptimizer.{self._instance}.bucket.{bucket.index}",
            bucket.buffer.dtype,
            bucket.buffer.device.type,
            ReduceOp.SUM,
            shape=(bucket.buffer.numel(),),
            digest=self._digest,
        )
        return engine_for(groups).submit(
            call, lambda _: bucket.launch(groups.data, local), named=True, cuda_tensor=bucket.buffer
        )

    def _complete_buckets(self) -> None:
        """Fill what this rank has no gradient for, launch what is left, and wait for every bucket."""
        for bucket in self._buckets[self._next_launch :]:
            # Parameters that got no gradient, or fewer than backward_passes_per_step of them, on this rank:
            # they take part with what they have (zeros for none), because the other ranks' buckets hold them.
            for position, filled in enumerate(bucket.filled):
                if not filled:
                    self._fill(bucket, position)
        self._launch_in_order(block=True)
        for ticket in self._launches:
            ticket.result()
        for bucket in self._buckets:
            if bucket.work is None:
                raise GradientSyncError(f"bucket {bucket.index} was never launched")
            try:
                bucket.work.wait()
            except CollectivesError:
                raise
            except Exception as error:
                # A peer died or the group broke mid-allreduce: Horovod's error, which elastic catches.
                raise HorovodInternalError(
                    f"bucket {bucket.index}: {type(error).__name__}: {error}"
                ) from error
        # On the GPU a bucket cut short by the abort after a peer's death may return from wait() untouched.
        failure = self._launches[0].failure() if self._launches and self._buckets[0].buffer.is_cuda else None
        if failure is not None:
            raise failure

    def synchronize(self) -> None:
        """Wait for every bucket's allreduce and write the averaged gradients into ``.grad``.

        Call it yourself before reading or modifying the reduced gradients (clipping,
        ``GradScaler.unscale_``); ``step()`` then does not reduce them again. Until the next backward pass,
        further calls do nothing. Raises :class:`MismatchError` if another rank of the set is not stepping
        an optimizer of the same layout.
        """
        if self._synchronized:
            return
        try:
            self._verified_now(block=True)
            self._complete_buckets()
        except BaseException:
            self._agreement.forget()
            self._reset()
            raise
        self._agreement.done(self._buckets)
        for bucket in self._buckets:
            result = bucket.result()
            if bucket.views:
                for p, slot in zip(bucket.params, bucket.slots, strict=True):
                    if p.grad is not slot:
                        p.grad = slot
            else:
                grads: list[torch.Tensor] = []
                for p in bucket.params:
                    if p.grad is None or p.grad.layout != torch.strided:
                        p.grad = torch.empty_like(p)
                    grads.append(p.grad)
                # One call for the bucket: per-parameter copies from Python cost more than the copying
                # itself on models with many small parameters.
                slots = bucket.slots if result is bucket.buffer else _views(result, bucket.params)
                torch._foreach_copy_(grads, slots)
        for index in self._densified:
            param = self._params[index]
            if param.grad is not None:
                param.grad = param.grad.to_sparse()
        self._reduce_sparse()
        self._reset()
        self._synchronized = True
        if self._ready_order is not None:
            ready_order, self._ready_order = self._ready_order, None
            self._rebuild_buckets(ready_order)

    def _reduce_sparse(self) -> None:
        """Gather the sparse gradients (Horovod's sparse allreduce), in parameter order on every rank."""
        if not self._sparse_params:
            return
        if self._local:
            for index, kept in self._sparse.items():
                self._params[index].grad = kept
            self._sparse.clear()
            return
        op = ReduceOp.AVERAGE if self._op is ReduceOp.AVERAGE else ReduceOp.SUM
        for index in sorted(self._sparse_params):
            param = self._params[index]
            grad = self._sparse.get(index)
            if grad is None:
                grad = torch.sparse_coo_tensor(
                    torch.empty((param.dim(), 0), dtype=torch.int64, device=param.device),
                    torch.empty((0, *param.shape[1:]), dtype=param.dtype, device=param.device),
                    param.shape,
                )
            param.grad = sparse_allreduce_async(grad.coalesce(), f"sparse.{index}", op, self._process_set())()
        self._sparse.clear()

    def _reset(self) -> None:
        for bucket in self._buckets:
            bucket.reset()
        for key in self._pass_counts:
            self._pass_counts[key] = 0
        self._next_launch = 0
        self._launches = []
        self._agreement.reset()

    def _join_step(self) -> None:
        """Take part, with zeros, in the step of the ranks that have not joined (see ``collectives.join``)."""
        # join() has exchanged this step's round already.
        self._agreement.verified = True
        self._agreement.forget()
        try:
            for bucket in self._buckets:
                for position, filled in enumerate(bucket.filled):
                    if not filled:
                        bucket.fill(position, None)
            self._complete_buckets()
        finally:
            self._reset()
        if self._ready_order is not None:
            self._ready_order = None
            self._rebuild_buckets([])

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's block for ``step()`` after ``synchronize()``.

        ``step()`` never reduces gradients that ``synchronize()`` has reduced already, inside this block or
        not; outside it, it warns as Horovod does, since code written for Horovod relies on the block.
        """
        self._skipping = True
        try:
            yield
        finally:
            self._skipping = False

    _skipping = False

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Average the gradients across ranks (unless synchronized already); then step the optimizer."""
        if closure is not None:
            raise GradientSyncError(
                "DistributedOptimizer.step() does not take a closure: a closure's backward pass would start "
                "allreduces that nothing waits for"
            )
        if self._synchronized and not self._skipping:
            warnings.warn(
                "optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize(); collectives does not reduce the gradients again, but Horovod "
                "would: wrap step() in optimizer.skip_synchronize() to keep the code right under both",
                stacklevel=2,
            )
        self.synchronize()
        return self._optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (the wrapped optimizer's ``zero_grad``)."""
        if any(self._pass_counts.values()):
            raise GradientSyncError(
                "zero_grad() was called after backward() but before step(): allreduces of those gradients "
                "are in flight; call step() (or synchronize()) first"
            )
        self._optimizer.zero_grad(set_to_none=set_to_none)
        # A new iteration: even if this rank's next backward reaches none of the parameters, its step() must
        # take part in the reduction that the other ranks' step() starts.
        self._synchronized = False

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
        """Detach the gradient hooks, leaving the parameters as they were before wrapping.

        ``step()`` still works afterwards, but reduces all buckets only when it is called, without overlap.
        """
        self._unhook()
        for p in self._params:
            if _owner_ref(p) is self._ref:
                del _OWNERS[p]

    def __repr__(self) -> str:
        return (
            f"DistributedOptimizer({self._optimizer.__class__.__name__}, buckets={len(self._buckets)}, "
            f"compression={getattr(self._compression, 'name', self._compression)}, "
            f"backward_passes_per_step={self._passes}, "
            f"op={self._op.name})"
        )
