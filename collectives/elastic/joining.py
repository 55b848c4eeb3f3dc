"""A rank that joined a running elastic job at a reset (a newcomer, started with ``DISTRUN_JOINED_AT_RESET``).

It runs its script from the start while the survivors wait in ``hvd.elastic.run``'s state sync. The usual
Horovod script broadcasts the model and the optimizer at top level, as non-elastic ones must; in a newcomer
those calls would meet the survivors' sync, collective for collective, and end the job in a MismatchError.
Until it enters ``hvd.elastic.run`` a newcomer skips them, saying so once: the sync that follows gives it the
same state from rank 0, which is all they were for.
"""

from __future__ import annotations

import logging
import os

__all__ = ["JOINED_VAR", "entered", "skips_top_level_broadcast"]

JOINED_VAR = "DISTRUN_JOINED_AT_RESET"
_log = logging.getLogger(__name__)
_entered = False
_said = False


def entered() -> None:
    """The rank is in ``hvd.elastic.run``: broadcasts are the state sync's (or the script's own) from here."""
    global _entered
    _entered = True


def skips_top_level_broadcast(what: str) -> bool:
    """Whether `what` (a broadcast of the model or optimizer state) is a newcomer's top-level one, skipped."""
    global _said
    if _entered or os.environ.get(JOINED_VAR) != "1":
        return False
    if not _said:
        _said = True
        _log.warning(
            "%s before hvd.elastic.run in a rank that joined at a reset: skipped, the state sync in "
            "hvd.elastic.run gives this rank rank 0's state",
            what,
        )
    return True
