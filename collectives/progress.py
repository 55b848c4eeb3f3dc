"""Each engine's latest collective, issued, agreed and done, for ``distrun stacks`` and ``distrun top``.

The engine updates a few fields of its set's :class:`Progress` per operation (references to what it holds
anyway: no allocation), and nothing more: under distrun, the rank's stack hook answers the agent's request
from another thread by calling :func:`snapshot` (``launcher.agent.progress``), so a rank pays nothing while
nobody asks.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["MOVING_WINDOW", "Progress", "progress_for", "snapshot"]

# How long `snapshot` watches the records for a change: a job on its way starts or ends an operation far more
# often (micro- to milliseconds apart), and the agent waits 0.5 s for the answers (launcher.agent.progress).
MOVING_WINDOW = 0.05


class Progress:
    """One process set's latest operations on this rank: each a sequence number (this rank's count of
    operations submitted to the set's engine since it started), a kind and the name Horovod would show."""

    __slots__ = (
        "done_kind",
        "done_name",
        "done_seq",
        "issued_kind",
        "issued_name",
        "issued_seq",
        "negotiated_kind",
        "negotiated_name",
        "negotiated_seq",
        "set_id",
    )

    def __init__(self, set_id: int) -> None:
        self.set_id = set_id
        self.issued_seq = self.negotiated_seq = self.done_seq = 0
        self.issued_kind: Any = None
        self.negotiated_kind: Any = None
        self.done_kind: Any = None
        self.issued_name = self.negotiated_name = self.done_name = ""

    def seqs(self) -> tuple[int, int, int]:
        return self.issued_seq, self.negotiated_seq, self.done_seq

    def to_json(self) -> dict[str, Any]:
        return {
            "source": "collectives",
            "process_set": self.set_id,
            "issued": _op(self.issued_seq, self.issued_kind, self.issued_name),
            "negotiated": _op(self.negotiated_seq, self.negotiated_kind, self.negotiated_name),
            "done": _op(self.done_seq, self.done_kind, self.done_name),
        }


def _op(seq: int, kind: Any, name: str) -> dict[str, Any] | None:
    if not seq:
        return None
    return {"seq": seq, "kind": str(getattr(kind, "name", kind)).lower(), "name": name}


_progress: dict[int, Progress] = {}


def progress_for(set_id: int) -> Progress:
    """A fresh record for the engine of ``set_id`` now starting (it replaces an earlier engine's)."""
    record = _progress[set_id] = Progress(set_id)
    return record


def snapshot(window: float = MOVING_WINDOW) -> dict[str, Any]:
    """What the agent reads: every engine's record ({"records": []} before any engine started), each with
    `moving`: whether it changed within `window` seconds. Each rank is read at its own moment, so a busy job's
    records always disagree a little; a set whose records move is on its way, not stalled, and the verdict
    accuses nobody of holding it up (launcher.diagnose.collective_verdict)."""
    records = list(_progress.values())
    before = [p.seqs() for p in records]
    if records and window > 0:
        time.sleep(window)  # on the answering thread, never the rank's own: the rank runs on meanwhile
    return {
        "records": [
            {**p.to_json(), "moving": p.seqs() != seen} for p, seen in zip(records, before, strict=True)
        ]
    }
