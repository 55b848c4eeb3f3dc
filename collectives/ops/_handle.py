"""What the collectives hand back: a :class:`Handle` on an operation in flight, Horovod's ``poll`` and
``synchronize`` on it, and how a collective reaches the set's engine (``collectives.engine``).

Every collective is submitted to its process set's engine with the function that issues it; the engine runs
that function once every rank has submitted the operation, and the handle waits first for that, then for
the communication. An operation that outlives its call holds its name until it is synchronized (or its handle
is dropped and it has run), as in Horovod, which refuses a second operation of the same name meanwhile. Any
failure of the communication itself reaches the caller as :class:`HorovodInternalError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist

from collectives.engine import Ticket
from collectives.engine_values import Fusion
from collectives.engines import _engines, engine_for
from collectives.errors import ArgumentError, CollectivesError, HorovodInternalError
from collectives.negotiation import Agreement, Call
from collectives.registry import _Groups

__all__ = ["Handle", "poll", "synchronize"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Part(Protocol[T_co]):
    """What an operation's start gives its handle's ticket: a :class:`Handle`, or a lighter object for
    operations that need no handle of their own (a share of a fused collective, a value already reduced).

    A tensor counts as its own part, already there: an allreduce reduced in its round settles its ticket with
    the reduced tensor, where an object around it was two Python calls an operation of a burst."""

    def wait(self) -> T_co: ...

    def is_completed(self) -> bool: ...


class _Ready(Generic[T]):
    """A result already there (an allreduce reduced from its round's payloads)."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def wait(self) -> T:
        return self.value

    def is_completed(self) -> bool:
        return True


# Names of async operations started and not yet synchronized: Horovod refuses a second one of the same name.
_in_flight: set[str] = set()


def _wait_work(work: dist.Work) -> None:
    try:
        work.wait()
    except CollectivesError:
        raise
    except Exception as error:
        raise HorovodInternalError(f"a collective failed: {type(error).__name__}: {error}") from error


def _on_gpu(result: Any) -> bool:
    if isinstance(result, torch.Tensor):
        return result.is_cuda
    if isinstance(result, (tuple, list)):
        return any(_on_gpu(part) for part in result)
    return False


def _raise_if_cut_short(ticket: Ticket, result: Any) -> None:
    """A GPU operation whose engine failed (a peer is gone) before it was synchronized: its NCCL
    communicator was aborted, so its result cannot be trusted, and Horovod raises for it."""
    failure = ticket.failure()
    if failure is not None and _on_gpu(result):
        raise failure


class Handle(Generic[T]):
    """An operation in flight; :meth:`wait` (or :func:`synchronize`) blocks until done, gives the result."""

    def __init__(
        self,
        works: Sequence[dist.Work],
        finish: Callable[[], T],
        name: str | None = None,
        ticket: Ticket | None = None,
        parts: Sequence[Handle[Any]] = (),
    ) -> None:
        # A list is kept as given: fused handles share one, emptied once its collective has been waited for.
        # An empty one is not kept: a submitted operation's handle has none, and each list is one more object
        # per operation for the garbage collector (``collectives.collector``).
        self._works: Sequence[dist.Work] = ()
        if works:
            self._works = works if isinstance(works, list) else list(works)
        self._finish = finish
        self._result: T | None = None
        self._done = False
        self._name = name
        self._ticket = ticket
        self._parts = tuple(parts)

    def is_completed(self) -> bool:
        """Whether the operation has finished (wait() will then not block on the network)."""
        if self._done:
            return True
        if self._parts:
            return all(part.is_completed() for part in self._parts)
        if self._ticket is not None:
            if not self._ticket.done():
                return False
            try:
                inner: _Part[T] | torch.Tensor = self._ticket.result()
            except CollectivesError:
                return True
            return isinstance(inner, torch.Tensor) or inner.is_completed()
        return all(work.is_completed() for work in self._works)

    def wait(self) -> T:
        """Block until the operation is complete and return its result; later calls return it again."""
        if not self._done:
            try:
                ticket = self._ticket
                if ticket is not None:
                    # Ticket.result's own first test, inline: a burst's handles find theirs settled.
                    done = ticket._done and ticket._error is None
                    inner: Any = ticket._value if done else ticket.result()
                    # A tensor is a Handle[Tensor]'s own result (see _Part).
                    self._result = inner if isinstance(inner, torch.Tensor) else inner.wait()  # type: ignore[assignment]
                    if ticket._engine is not None and ticket._engine.broken is not None:
                        _raise_if_cut_short(ticket, self._result)
                else:
                    for work in self._works:
                        _wait_work(work)
                    self._result = self._finish()
                self._done = True
            finally:
                name = self._name
                if name is not None:  # _release_name, inline: a call fewer per operation
                    _in_flight.discard(name)
                    self._name = None
        return self._result  # type: ignore[return-value]

    def _release_name(self) -> None:
        if self._name is not None:
            _in_flight.discard(self._name)
            self._name = None

    def __del__(self) -> None:
        # A dropped handle frees its name once the operation has run, as Horovod's does.
        name, ticket = self._name, self._ticket
        if name is None:
            return
        if ticket is None:
            _in_flight.discard(name)
        else:
            ticket.on_done(lambda: _in_flight.discard(name))


def _submit(
    call: Call,
    groups: _Groups,
    issue: Callable[[Agreement], _Part[T]],
    *,
    claim: bool,
    fusion: Fusion | None = None,
    tensor: torch.Tensor | None = None,
    row: list[int] | None = None,
) -> Handle[T]:
    """Submit ``call`` to the set's engine; ``issue(agreement)`` starts the communication once every rank has
    submitted it (``row``: the call's row when the caller has it at hand). ``claim``: an ``_async``
    operation, matched by its name and holding it until synchronized; otherwise it is matched by its place in
    the set's ordered sequence."""
    name = call.name if claim else None
    if name is not None:
        if name in _in_flight:
            raise ArgumentError(
                f"an operation named {name!r} is in flight already: synchronize it before reusing the name"
            )
        _in_flight.add(name)
    if groups.size == 1:
        ticket = Ticket()
        try:
            ticket._settle(issue(Agreement([call.row()], ())), None)
        except CollectivesError as error:
            ticket._settle(None, error)
    else:
        # A blocking call runs the rounds on its own thread; an _async one leaves them to the engine thread.
        engine = _engines.get(groups.set_id)  # engine_for's own first look, inline: a call fewer
        if engine is None or engine.groups is not groups:
            engine = engine_for(groups)
        if claim:
            ticket = engine.enqueue(call, issue, named=True, fusion=fusion, cuda_tensor=tensor, row=row)
        else:
            ticket = engine.submit(
                call, issue, named=False, fusion=fusion, cuda_tensor=tensor, drive=True, row=row
            )
    return Handle((), _unreachable, name, ticket)


def _unreachable() -> Any:
    raise AssertionError("a submitted operation's result comes from its ticket")


@contextlib.contextmanager
def _turn(call: Call, groups: _Groups) -> Iterator[Agreement]:
    """Agree on ``call`` in the set's ordered sequence, then hold the data group for the caller's own
    collectives until the block ends (objects, join, barrier, the optimizer's buckets)."""
    if groups.size == 1:
        yield Agreement([call.row()], ())
        return
    turn = engine_for(groups).turn(call)
    try:
        yield turn.wait()
    finally:
        turn.release()


def _agree(call: Call, groups: _Groups, *, claim: bool = False) -> Agreement:
    """Agree on ``call`` in order, for code that issues nothing on the data group after it."""
    with _turn(call, groups) as agreement:
        return agreement


def poll(handle: Handle[Any]) -> bool:
    """Whether the operation behind ``handle`` has finished (Horovod's ``hvd.poll``)."""
    return handle.is_completed()


def synchronize(handle: Handle[T] | Callable[[], T]) -> T:
    """Wait for ``handle`` and return the operation's result (Horovod's ``hvd.synchronize``)."""
    if isinstance(handle, Handle):
        return handle.wait()
    return handle()


def _combined(handles: Sequence[Handle[T]]) -> Handle[list[T]]:
    """One handle on several operations (the grouped collectives that run one operation per tensor)."""
    return Handle([], lambda: [h.wait() for h in handles], parts=handles)
