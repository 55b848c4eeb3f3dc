"""What an engine says when something stalls or breaks: the stall check's text, as Horovod's names tensors,
and the failure of a round whose peer left cleanly, which gloo would blame on "a remote worker crashing"."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from collectives.engine_tickets import Ticket
from collectives.errors import CollectivesError, HorovodInternalError

__all__ = ["StallCheck", "attempt", "failure_message", "log_stall", "missing_text", "stall_texts"]

_log = logging.getLogger("collectives")


class Stalls(Protocol):
    """What the stall check reads: the round table (``engine_rounds.Table``, a module beside this one)."""

    def stalled(
        self, older_than_s: float, ranks: tuple[int, ...], reporter: int | None = None
    ) -> dict[int, list[str]]: ...


def missing_text(missing: dict[int, list[str]]) -> str:
    return "; ".join(f"rank {rank} missing {sorted(names)}" for rank, names in sorted(missing.items()))


def stall_texts(
    table: Stalls, older_than_s: float, ranks: tuple[int, ...], index: int | None
) -> tuple[str, str]:
    """(every stalled operation, for the engine thread's name; those this rank logs: the ones it submitted
    first, whose names it knows)."""
    every = missing_text(table.stalled(older_than_s, ranks))
    return every, missing_text(table.stalled(older_than_s, ranks, reporter=index)) if every else ""


def log_stall(set_id: int, seconds: float, text: str) -> None:
    _log.warning(
        "One or more operations were submitted by a subset of the ranks of process set %d and have waited "
        "for the others for more than %.0f seconds (stall check): %s",
        set_id,
        seconds,
        text,
    )


class StallCheck:
    """An engine's stall check (``HOROVOD_STALL_CHECK_*``), run from its rounds at most once a period, and its
    last finding, which the engine thread's name shows (``distrun stacks``)."""

    def __init__(self, set_id: int, enabled: bool, period_s: float, now: float | None = None) -> None:
        self.set_id = set_id
        self.enabled = enabled
        self.period_s = period_s
        self.text = ""  # which ranks miss which names; "" when nothing stalls
        self._last = time.monotonic() if now is None else now

    def run(self, table: Stalls, ranks: tuple[int, ...], index: int | None, now: float) -> bool:
        """Check, if a period has passed since the last check; whether the finding changed."""
        if not self.enabled or now - self._last < self.period_s:
            return False
        self._last = now
        text, mine = stall_texts(table, self.period_s, ranks, index)
        if mine:  # logged by the first rank that submitted each stalled operation: it knows the names
            log_stall(self.set_id, self.period_s, mine)
        changed, self.text = text != self.text, text
        return changed


def failure_message(set_id: int, error: BaseException, left: list[int], waiting: Iterable[str]) -> str:
    """A failed round's error: `left`, the ranks whose engines had announced their stop (the script ended or
    called shutdown()), are named as such, with what this rank waited for."""
    if not left:
        return (
            f"process set {set_id}: a collective failed ({type(error).__name__}: {error}); the job's process "
            "group must be re-formed"
        )
    who = f"rank {left[0]}" if len(left) == 1 else f"ranks {left}"
    names = sorted(set(waiting))
    return (
        f"process set {set_id}: {who} shut down collectives (the script ended or called shutdown()) while "
        f"this rank waited for {names or 'its next round'}; the connection closed ({type(error).__name__})"
    )


def attempt(ticket: Ticket, label: str, run: Callable[[], Any]) -> tuple[bool, Any]:
    """`run()`'s value; on an error ``ticket`` is settled with it (a failure of the transport as
    HorovodInternalError, naming ``label``) and (False, None) comes back."""
    try:
        return True, run()
    except CollectivesError as error:
        ticket._settle(None, error)
    except Exception as error:
        ticket._settle(None, HorovodInternalError(f"{label}: {type(error).__name__}: {error}"))
    return False, None
