"""Which ranks are behind in their collectives, and where the others wait: the verdict made exact (pure).

Each rank's agent asks it for its latest collectives (`launcher.agent.progress`, answered by
`collectives.progress`): per process set, the last one issued, agreed and done, each a sequence number (the
rank's count of operations submitted to that set), a kind and the name Horovod shows; or torch's own flight
recorder's last enqueued and completed collective per process group. From those alone, this module says what
Horovod's stall report says, made exact: "ranks 0-2 wait in allreduce `grad.w` (#12, process set 0); rank 3
never issued it: its last completed is #11; rank 3's stack: train.py:88 in data_loader".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Op", "RankProgress", "collective_verdict", "progress_line", "record_json", "records_of"]


@dataclass(frozen=True)
class Op:
    """One collective of a rank: its sequence number, kind (`allreduce`) and name."""

    seq: int
    kind: str
    name: str

    @classmethod
    def from_json(cls, data: Any) -> Op | None:
        if not isinstance(data, dict):
            return None
        try:
            seq = int(data.get("seq") or 0)
        except (TypeError, ValueError):
            return None
        return cls(seq, str(data.get("kind") or ""), str(data.get("name") or "")) if seq > 0 else None

    def text(self, process_set: int | None = None) -> str:
        where = f"#{self.seq}" + ("" if process_set is None else f", process set {process_set}")
        return f"{self.kind} `{self.name}` ({where})" if self.name else f"{self.kind} ({where})"


@dataclass(frozen=True)
class RankProgress:
    """One rank's record of one process set: `source` "collectives" or "torch"; `note` says why a rank has no
    columns (torch's backend keeps no trace); `moving`: the record changed while the rank was read (its
    collectives are on their way)."""

    rank: int
    process_set: int = 0
    source: str = "collectives"
    issued: Op | None = None
    done: Op | None = None
    note: str = ""
    moving: bool = False

    @property
    def pending(self) -> bool:
        """Something issued is not done: the rank waits in (or for) a collective."""
        return self.issued is not None and (self.done is None or self.done.seq < self.issued.seq)


def records_of(rank: int, data: Any) -> tuple[RankProgress, ...]:
    """A rank's records from its agent's answer (a list of dicts); whatever is malformed is left out."""
    out: list[RankProgress] = []
    for item in data if isinstance(data, list) else ():
        if not isinstance(item, dict):
            continue
        try:
            process_set = int(item.get("process_set") or 0)
        except (TypeError, ValueError):
            continue
        out.append(
            RankProgress(
                rank,
                process_set,
                str(item.get("source") or "collectives"),
                Op.from_json(item.get("issued")),
                Op.from_json(item.get("done")),
                str(item.get("note") or ""),
                item.get("moving") is True,
            )
        )
    return tuple(out)


def record_json(record: RankProgress) -> dict[str, Any]:
    """The report's form (docs/report.schema.json, a stack dump's `collectives`)."""

    def op(o: Op | None) -> dict[str, Any] | None:
        return None if o is None else {"seq": o.seq, "kind": o.kind, "name": o.name}

    return {
        "rank": record.rank,
        "process_set": record.process_set,
        "source": record.source,
        "issued": op(record.issued),
        "done": op(record.done),
        "note": record.note or None,
        "moving": record.moving,
    }


def progress_line(records: Sequence[RankProgress]) -> str:
    """What `distrun stacks` prints beside a rank's stack: its last collective issued and last completed."""
    parts = []
    for r in records:
        if r.note:
            parts.append(r.note)
            continue
        where = f"process set {r.process_set}" + (f", {r.source}" if r.source != "collectives" else "")
        where += ", moving" if r.moving else ""
        issued = r.issued.text() if r.issued else "none since init()"
        done = f"#{r.done.seq}" if r.done else "none"
        parts.append(f"last issued {issued}, last completed {done} ({where})")
    return "; ".join(parts)


def _ranges(ranks: Iterable[int]) -> str:
    from launcher.diagnose.stacks import ranks_label

    return ranks_label(sorted(set(ranks)))


def collective_verdict(
    progress: Mapping[int, Sequence[RankProgress]], world: Sequence[int], places: Mapping[int, str]
) -> str | None:
    """The verdict from the ranks' records, or None when they say nothing of a wait (no rank has a
    collective pending, or no rank keeps records). `progress`: rank -> its records; `world`: every rank of the
    job; `places`: rank -> where its main thread is (`func, file.py:88`), for the ranks behind."""
    if not any(r.issued for records in progress.values() for r in records):
        return None
    sets = sorted({r.process_set for records in progress.values() for r in records if r.pending})
    lines = [line for s in sets if (line := _set_verdict(s, progress, world, places))]
    return "; ".join(lines) or None


def _set_verdict(
    process_set: int,
    progress: Mapping[int, Sequence[RankProgress]],
    world: Sequence[int],
    places: Mapping[int, str],
) -> str | None:
    mine = {
        rank: r
        for rank, records in progress.items()
        for r in records
        if r.process_set == process_set and not r.note
    }
    if any(r.moving for r in mine.values()):
        # Every rank is read at its own moment, so a busy set's records never quite agree: one whose records
        # moved while they were read is on its way, and naming a rank "behind" in it would be false.
        return None
    waiting: dict[tuple[int, str, str], list[int]] = {}
    for rank, r in sorted(mine.items()):
        if r.pending and r.issued is not None:
            waiting.setdefault((r.issued.seq, r.issued.kind, r.issued.name), []).append(rank)
    if not waiting:
        return None
    # Where most ranks wait (the lowest sequence number among equals): the operation the others hold up.
    (seq, kind, name), ranks = max(waiting.items(), key=lambda item: (len(item[1]), -item[0][0]))
    op = Op(seq, kind, name)
    # The global set's members are every rank of the job, a rank without records included; another set's
    # are those that reported it.
    members = sorted(set(world) | set(mine)) if process_set == 0 else sorted(mine)
    behind = []
    for rank in members:
        record = mine.get(rank)
        if record is not None and record.issued is not None and record.issued.seq >= seq:
            continue
        if record is not None and record.pending:
            continue  # waiting in an earlier operation of its own: named below with the others
        behind.append(rank)
    parts = [f"{_ranges(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {op.text(process_set)}"]
    for rank in behind:
        record = mine.get(rank)
        if record is None:
            last = "it keeps no record of its collectives (not using collectives, or not initialised)"
        elif record.issued is None:
            last = "it has issued no collective since init()"
        else:
            done = record.done
            last = f"its last completed is #{done.seq}" if done is not None else "it has completed none"
        place = places.get(rank)
        tail = f"; rank {rank}'s stack: {place}" if place else ""
        parts.append(f"rank {rank} never issued it: {last}{tail}")
    others = [(key, rs) for key, rs in sorted(waiting.items()) if key != (seq, kind, name)]
    if others and not behind:
        # Ranks in different operations and none outside: a job on its way (each rank's record is read at
        # its own moment), or a tangle the stacks tell better.
        return None
    for (oseq, okind, oname), rs in others:
        parts.append(
            f"{_ranges(rs)} {'waits' if len(rs) == 1 else 'wait'} in {Op(oseq, okind, oname).text()}"
        )
    if not behind and not others:
        parts.append("every rank issued it")
    return "; ".join(parts)
