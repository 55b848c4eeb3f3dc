"""Leaving the process group together, at :func:`collectives.shutdown` and at interpreter exit.

gloo aborts a process with std::terminate ("terminate called without an active exception", exit 134) when a
peer closes its connections while messages of the last operation are still on their way. Exiting without
``destroy_process_group()`` makes that a race between the ranks' exits: a 3-rank job whose ranks simply return
died of it in about one run of four (plain ``torch.distributed`` scripts under torchrun alike). So the ranks
leave only once every one of them has arrived (a round on the rendezvous store, which carries no gloo message
that could itself be in flight), and rank 0, which serves the store, leaves last.

Most scripts never call ``shutdown()``, so :func:`init` registers the same leave for interpreter exit. There
it must not hold up a failing rank, whose peers may be waiting in a collective for it: after an uncaught
exception or ``sys.exit(non-zero)`` it destroys its group at once without waiting (the launcher stops the
others, or they fail on their own), and otherwise it waits for the others at most ``EXIT_WAIT_S``, which also
bounds a failing end that Python gives no way to see (``raise SystemExit(3)`` at top level).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn

_log = logging.getLogger("collectives")

EXIT_WAIT_S = 10.0
_ARRIVED = "collectives/leave/arrived"
_ALL = "collectives/leave/all"
_LEFT = "collectives/leave/left/"

_registered_in: int | None = None  # the pid whose exit runs the hook (never a fork of it)
_exit_status: str | int | None = None
_sys_exit = sys.exit


def together(rank: int, size: int, wait_s: float | None) -> None:
    """Return once every rank has reached this call and, on rank 0, once every other rank is past it.

    Destroy the process group right after. ``wait_s`` bounds each wait (None: the store's own timeout); a rank
    that does not come in time is logged, and nothing more waits for it.
    """
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    try:
        if store.add(_ARRIVED, 1) == size:
            store.set(_ALL, "1")
        _wait(store, [_ALL], wait_s)
        if rank != 0:
            store.set(f"{_LEFT}{rank}", "1")
        else:
            # The others still talk to the store that rank 0 serves until they have said so.
            _wait(store, [f"{_LEFT}{r}" for r in range(1, size)], wait_s)
    except RuntimeError as error:  # DistStoreError: a timeout, or rank 0 (the store) already gone
        _log.warning("rank %d leaves without every rank: %s", rank, str(error).splitlines()[0])


def _wait(store: object, keys: list[str], wait_s: float | None) -> None:
    if wait_s is None:
        store.wait(keys)  # type: ignore[attr-defined]
    else:
        store.wait(keys, datetime.timedelta(seconds=wait_s))  # type: ignore[attr-defined]


def leave_at_exit(leave: Callable[[float], None]) -> None:
    """Run ``leave(seconds to wait for the others)`` when this process exits (registered once per process)."""
    global _registered_in, _exit_status
    if _registered_in == os.getpid():
        return
    _registered_in = os.getpid()
    _exit_status = None
    atexit.register(_at_exit, leave)
    sys.exit = _recording_exit


def _recording_exit(status: str | int | None = None, /) -> NoReturn:
    # Python keeps a SystemExit's status from atexit hooks; this keeps the common way of raising one.
    global _exit_status
    _exit_status = status
    _sys_exit(status)


def _at_exit(leave: Callable[[float], None]) -> None:
    if os.getpid() != _registered_in:
        return  # a forked child (a data-loader worker) shares the parent's hooks, not its group
    # The interpreter sets sys.last_value just before it reports an uncaught exception, whoever's excepthook
    # prints it.
    failing = hasattr(sys, "last_value") or _exit_status not in (None, 0)
    leave(0.0 if failing else EXIT_WAIT_S)
