"""Rank-0-only checkpoints: one process writes, every process gets the same state back.

Writing from every rank would have N processes race on one file (on a shared file system) or leave N
diverging copies; so the coordinator writes, atomically, and the others wait at a barrier. Loading happens
on the root only and the state is broadcast, so the file need not be visible from the other hosts.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collectives import context

__all__ = ["load_checkpoint", "save_checkpoint"]

_log = logging.getLogger(__name__)


def save_checkpoint(
    state: Mapping[str, Any], path: str | os.PathLike[str], *, root_rank: int = 0
) -> Path | None:
    """Write ``state`` with ``torch.save`` on ``root_rank`` only; returns the path there, None elsewhere.

    The file is replaced atomically (a crash mid-write leaves the previous checkpoint intact), and every rank
    returns only after it exists.
    """
    ctx = context._require("save_checkpoint")
    target = Path(path)
    written: Path | None = None
    if ctx.topology.rank == root_rank:
        import torch

        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(dict(state), handle)
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        _log.info("checkpoint written to %s", target)
        written = target
    context.barrier()
    return written


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    root_rank: int = 0,
    weights_only: bool = True,
) -> dict[str, Any] | None:
    """Load a checkpoint on ``root_rank`` and broadcast it; None on every rank when the file does not exist.

    Tensors come back on the CPU; ``model.load_state_dict`` / ``optimizer.load_state_dict`` move them to the
    parameters' devices.
    """
    ctx = context._require("load_checkpoint")
    from collectives.ops import broadcast_object

    state: dict[str, Any] | None = None
    if ctx.topology.rank == root_rank:
        target = Path(path)
        if target.exists():
            import torch

            state = torch.load(target, map_location="cpu", weights_only=weights_only)
            _log.info("checkpoint loaded from %s", target)
    return broadcast_object(state, root_rank)
