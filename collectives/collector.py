"""The cyclic garbage collector and a training process's long-lived objects.

Python's full collection walks every object the collector tracks; with torch imported that is some 170,000
objects and 100-150 ms on a small machine. A step's collective calls allocate tracked objects (handles, the
engine's entries) that live until the step ends, so they outlive the young collections and count toward
the next full one: 1,000 named allreduces a step brought a full pass every five steps, a third of the step
time. :func:`collectives.init` therefore collects once and freezes what exists then (``gc.freeze``): the
modules, classes and functions of torch and of the script, which live as long as the process, are left out
of every later pass, and a full pass walks only what was made since.

Reference counting still frees frozen objects. Only a reference cycle among objects made before ``init()``
that becomes garbage later is never collected; ``COLLECTIVES_GC_FREEZE=0`` keeps the collector as it was.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Mapping

__all__ = ["FREEZE_VAR", "freeze_long_lived"]

FREEZE_VAR = "COLLECTIVES_GC_FREEZE"

_log = logging.getLogger(__name__)


def freeze_long_lived(environ: Mapping[str, str]) -> bool:
    """Collect, then move every tracked object to the collector's permanent generation; whether it did."""
    if environ.get(FREEZE_VAR, "1").strip() == "0" or not gc.isenabled():
        return False
    start = time.perf_counter()
    gc.collect()  # garbage that exists now is freed, not frozen
    gc.freeze()
    _log.debug(
        "froze %d objects out of later collections (%.0f ms)",
        gc.get_freeze_count(),
        (time.perf_counter() - start) * 1000,
    )
    return True
