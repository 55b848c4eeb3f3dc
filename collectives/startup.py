"""Horovod's ``hvd.init()``: join the process group, then register the process sets it is given.

Above ``collectives.context`` (which joins the group) and ``collectives.process_sets`` (which registers
sets collectively), so that ``init(process_sets=[...])`` works as in Horovod.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from collectives import context
from collectives.context import DEFAULT_TIMEOUT_S, Topology
from collectives.process_sets import ProcessSet, add_process_set

__all__ = ["init"]


def init(
    backend: str | None = None,
    timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
    *,
    process_sets: Sequence[ProcessSet | Sequence[int]] | None = None,
    comm: Any = None,
) -> Topology:
    """Join the job's process group (see :func:`collectives.context.init`) and register ``process_sets``,
    every rank with the same sets in the same order. ``comm`` is Horovod's MPI communicator: there is no MPI
    here, so it must be None.
    """
    if comm is not None:
        raise NotImplementedError("init(comm=...) takes an MPI communicator; collectives does not use MPI")
    topology = context.init(backend, timeout, environ)
    for process_set in process_sets or ():
        if isinstance(process_set, ProcessSet) and process_set.process_set_id is not None:
            continue
        add_process_set(process_set)
    return topology
