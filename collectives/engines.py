"""The process's engines (:mod:`collectives.engine`): one per process set, the global set's started by
``init()`` and the others' on first use, stopped
together at ``shutdown()``, one at ``remove_process_set``, and reset together by an elastic reset."""

from __future__ import annotations

import contextlib
import threading

from collectives.engine import Engine
from collectives.engine_values import Settings
from collectives.errors import HorovodInternalError
from collectives.negotiation import Call, Kind
from collectives.registry import _Groups, _registered, _setup_hooks, _teardown_hooks

__all__ = ["engine_for", "reset_engines", "shutdown_engines", "stall_report", "stop_engine"]

_engines: dict[int, Engine] = {}
_engines_lock = threading.Lock()


def engine_for(groups: _Groups) -> Engine:
    """The engine of ``groups``' process set, started on first use."""
    engine = _engines.get(groups.set_id)
    if engine is not None and engine.groups is groups:
        return engine
    with _engines_lock:
        engine = _engines.get(groups.set_id)
        if engine is None or engine.groups is not groups:
            engine = _engines[groups.set_id] = Engine(groups, Settings.from_env())
        return engine


def shutdown_engines(wait_s: float | None) -> None:
    """The orderly stop of every engine, all ranks together (``collectives.shutdown()`` and exit).

    An explicit ``shutdown()`` (``wait_s`` None) is first agreed in the job's ordered sequence: a rank that is
    in a collective instead makes every rank raise :class:`MismatchError` (and this rank stays initialised),
    where the ranks that stop would otherwise wait for it for ever, and it for them.
    """
    world = _registered.get(0)
    if wait_s is None and world is not None and world.size > 1 and world.index is not None:
        # A peer that is gone already leaves nobody to wait for: the leave goes on as before.
        with contextlib.suppress(HorovodInternalError):
            engine_for(world).agree(Call(Kind.SHUTDOWN)).result()
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        if wait_s == 0:
            engine.reset(
                HorovodInternalError("collectives left the process group with this operation pending")
            )
        else:
            engine.shutdown(wait_s)


def stop_engine(set_id: int) -> None:
    """The orderly stop of one set's engine, its members together (``remove_process_set``)."""
    with _engines_lock:
        engine = _engines.pop(set_id, None)
    if engine is not None:
        engine.shutdown(None)


def reset_engines(error: HorovodInternalError | None = None) -> None:
    """For the elastic reset: fail every pending handle with ``error``, stop every engine thread without
    talking to peers, and forget the engines; the next operation starts a fresh engine on the new groups."""
    failure = error or HorovodInternalError("the process group was reset with this operation pending")
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.reset(failure)


def stall_report() -> dict[int, str]:
    """Process set id -> which ranks miss which operations, for every engine that has found a stall."""
    return {set_id: e.stall_report() for set_id, e in _engines.items() if e.stall_report()}


def _start_world(groups: _Groups) -> None:
    """Start the global set's engine at init(), as Horovod starts its background thread there: a rank that
    runs no collective for a while still answers the others' rounds, so their stall check names it, and
    distrun sees that it has issued nothing yet."""
    if groups.size > 1:
        engine_for(groups)


_setup_hooks.append(_start_world)
_teardown_hooks.append(shutdown_engines)
