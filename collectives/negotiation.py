"""How the ranks of a process set agree on a collective before it starts, so that mismatches raise everywhere.

Horovod's coordinator compares every rank's request (operation, name, dtype, shape, op, root rank) before a
tensor moves, and answers a mismatch with the same error on every rank. Here each rank announces a fixed
row of int64 in its engine's agreement round (``collectives.engine_rounds``); every rank then holds every
row and reaches the same verdict. The row has an agreed part, which must be equal on all ranks, and a free
part of per-rank facts (allgather's first dimension) that the collective needs anyway, so allgather pays no
extra exchange for its sizes.

Rows are cached per request (Horovod caches its responses per tensor name): a training loop that reduces the
same named tensors every step builds each row once.

A joined rank answers every round with a JOIN row and takes part, with zeros, in the allreduces of the
others (see ``collectives.coordination``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from collectives.errors import CollectivesError, MismatchError
from collectives.reduce_op import ReduceOp
from collectives.registry import _Groups, _registered

__all__ = ["Agreement", "Call", "Kind", "dtype_code", "row_of"]

ROW = 32
_AGREED = 28  # fields [0, _AGREED) must be equal on every rank; the rest are per-rank facts
_MAX_DIMS = _AGREED - 8
_CACHE_LIMIT = 4096


class Kind(enum.IntEnum):
    """The collective a row asks for."""

    ALLREDUCE = 1
    GROUPED_ALLREDUCE = 2
    ALLGATHER = 3
    GROUPED_ALLGATHER = 4
    BROADCAST = 5
    ALLTOALL = 6
    REDUCESCATTER = 7
    GROUPED_REDUCESCATTER = 8
    BARRIER = 9
    JOIN = 10
    BROADCAST_OBJECT = 11
    ALLGATHER_OBJECT = 12
    OPTIMIZER_STEP = 13
    ADD_PROCESS_SET = 14
    REMOVE_PROCESS_SET = 15
    SHUTDOWN = 16


_OP_CODES = {op: index + 1 for index, op in enumerate(ReduceOp)}
_OPS_BY_CODE = {code: op for op, code in _OP_CODES.items()}
_DEVICE_CODES = {"cpu": 1, "cuda": 2}
# Collectives that ranks which have not joined may run while others have: Horovod's joined ranks take part
# in allreduces only (with zeros); a barrier is the exchange itself.
_JOINABLE = {Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE, Kind.OPTIMIZER_STEP, Kind.BARRIER}


def dtype_code(dtype: torch.dtype) -> int:
    """A number naming ``dtype`` identically in every process (str(dtype) is stable, id() is not)."""
    return zlib.crc32(str(dtype).encode())


_DTYPES_BY_CODE = {dtype_code(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _name_code(name: str | None) -> int:
    return 0 if name is None else zlib.crc32(name.encode()) + 1


@dataclasses.dataclass(frozen=True)
class Call:
    """One rank's request. ``shape`` is compared (allgather passes its trailing dimensions only); ``free``
    holds per-rank facts; ``digest`` summarises what does not fit (grouped tensors' shapes)."""

    kind: Kind
    name: str | None = None
    dtype: torch.dtype | None = None
    device: str = "cpu"
    op: ReduceOp | None = None
    root: int = -1
    shape: tuple[int, ...] = ()
    digest: int = 0
    free: tuple[int, ...] = ()

    def row(self) -> list[int]:
        if len(self.shape) > _MAX_DIMS:
            raise CollectivesError(f"{self.kind.name.lower()} supports at most {_MAX_DIMS} dimensions")
        values = [
            int(self.kind),
            0 if self.dtype is None else dtype_code(self.dtype),
            _DEVICE_CODES.get(self.device, 3),
            0 if self.op is None else _OP_CODES[self.op],
            self.root,
            _name_code(self.name),
            len(self.shape),
            self.digest,
            *self.shape,
        ]
        values += [-1] * (_AGREED - len(values))
        values += list(self.free) + [-1] * (ROW - _AGREED - len(self.free))
        return values


@dataclasses.dataclass(frozen=True)
class Agreement:
    """The verdict of one exchange: every rank's row, and which ranks (positions in the set) have joined."""

    rows: list[list[int]]
    joined: tuple[int, ...]

    def free(self, position: int) -> list[int]:
        return self.rows[position][_AGREED:]


_row_lists: dict[Call, list[int]] = {}
# Global ranks seen joined in the rounds since the last completed join(); join() needs them to name the last.
_joined_seen: set[int] = set()


def row_of(call: Call) -> list[int]:
    """``call.row()`` without its trailing -1s (padding: ``row + [-1] * (ROW - len(row))`` restores it),
    built once per request (the list is shared: callers must not change it)."""
    cached = _row_lists.get(call)
    if cached is None:
        if len(_row_lists) >= _CACHE_LIMIT:
            _row_lists.clear()
        cached = call.row()
        while cached and cached[-1] == -1:
            cached.pop()
        _row_lists[call] = cached
    return cached


def _verdict(call: Call, groups: _Groups, rows: list[list[int]]) -> Agreement:
    mine = rows[groups.index or 0][:_AGREED]
    if all(row[:_AGREED] == mine for row in rows):
        return Agreement(rows, tuple(range(len(rows))) if call.kind == Kind.JOIN else ())
    joined = tuple(i for i, row in enumerate(rows) if row[0] == Kind.JOIN)
    if joined and groups.ranks == _registered[0].ranks:
        _joined_seen.update(groups.ranks[i] for i in joined)
        if call.kind == Kind.JOIN:
            # A joined rank accepts whatever the others do; join() decides how to take part.
            return Agreement(rows, joined)
        active = [row[:_AGREED] for row in rows if row[0] != Kind.JOIN]
        if all(row == mine for row in active):
            if call.kind in _JOINABLE and call.op in (None, ReduceOp.SUM, ReduceOp.AVERAGE):
                return Agreement(rows, joined)
            raise MismatchError(
                f"{_what(call.kind)} cannot run while rank(s) {[groups.ranks[i] for i in joined]} have "
                "called join(): after join, Horovod lets the other ranks run only Sum or Average allreduces"
            )
    raise MismatchError(_describe(groups, rows) + _after_a_reset())


# After a reset, a newcomer runs its script from the top while the others sync the state in hvd.elastic.run.
NEWCOMER_HINT = (
    "; after a reset, a rank that joins runs the script from its start: a top-level broadcast there meets "
    "the others' state sync. Fix: remove the top-level hvd.broadcast_parameters/broadcast_optimizer_state "
    "calls; hvd.elastic.run syncs the state from rank 0 (docs/elastic.md, What a script must do)"
)


def _after_a_reset() -> str:
    """The elastic pattern to use, where the job has reset in place (the usual cause of a mismatch there)."""
    elastic = os.environ.get("DISTRUN_ELASTIC_SOCKET")
    resets = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return NEWCOMER_HINT if elastic and resets.isdigit() and int(resets) > 0 else ""


def _what(kind: int) -> str:
    try:
        return Kind(kind).name.lower()
    except ValueError:
        return f"unknown collective {kind}"


def _field(rows: list[list[int]], ranks: Sequence[int], index: int, show: Callable[[list[int]], Any]) -> str:
    values = [show(row) for row in rows]
    return ", ".join(f"rank {rank}: {value}" for rank, value in zip(ranks, values, strict=True))


def _shape(row: list[int]) -> list[int]:
    return row[8 : 8 + row[6]]


def _describe(groups: _Groups, rows: list[list[int]]) -> str:
    """Horovod's wording for the first field that differs, with every rank's value."""
    ranks = groups.ranks
    kinds = {row[0] for row in rows}
    if len(kinds) > 1:
        listing = _field(rows, ranks, 0, lambda row: _what(row[0]))
        return f"Mismatched collective operations: ranks called different collectives ({listing})"
    what = _what(rows[0][0])
    checks: list[tuple[int, str, Callable[[list[int]], Any]]] = [
        (5, "names", lambda row: "(no name)" if row[5] == 0 else f"name code {row[5]}"),
        (
            1,
            "data types",
            lambda row: str(_DTYPES_BY_CODE.get(row[1], f"unknown {row[1]}")).replace("torch.", ""),
        ),
        (2, "devices", lambda row: {v: k for k, v in _DEVICE_CODES.items()}.get(row[2], "other")),
        (3, "reduction ops", lambda row: _OPS_BY_CODE[row[3]].name if row[3] in _OPS_BY_CODE else "none"),
        (4, "root ranks", lambda row: row[4]),
    ]
    for index, label, show in checks:
        if len({row[index] for row in rows}) > 1:
            return f"Mismatched {what} {label}: {_field(rows, ranks, index, show)}"
    if len({tuple(_shape(row)) for row in rows}) > 1:
        noun = "trailing dimensions" if rows[0][0] == Kind.ALLGATHER else "tensor shapes"
        return f"Mismatched {what} {noun}: {_field(rows, ranks, 8, _shape)}"
    return f"Mismatched {what} tensors (number, shapes or types of the grouped tensors differ across ranks)"


def shape_digest(tensors: Sequence[torch.Tensor]) -> int:
    """A number summarising the dtypes and shapes of ``tensors``, for grouped collectives."""
    # Two reprs of lists rather than a string per tensor: half the time for a grouped call of 64.
    text = repr(([t.shape for t in tensors], [t.dtype for t in tensors]))
    return zlib.crc32(text.encode())


def dtype_of(code: int) -> torch.dtype:
    dtype = _DTYPES_BY_CODE.get(code)
    if dtype is None:
        raise CollectivesError(f"unknown dtype code {code}")
    return dtype


def op_of(code: int) -> ReduceOp | None:
    return _OPS_BY_CODE.get(code)
