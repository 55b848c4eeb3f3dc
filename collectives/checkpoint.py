"""Rank-0-only checkpoints: one process writes, every process gets the same state back.

Writing from every rank would have N processes race on one file (on a shared file system) or leave N
diverging copies; so the coordinator writes, atomically, and the others wait for it to report the outcome.
Loading happens on the root only and the state is broadcast, so the file need not be visible from the other
hosts.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collectives import context
from collectives.errors import CollectivesError

__all__ = ["load_checkpoint", "save_checkpoint"]

_log = logging.getLogger(__name__)


def save_checkpoint(
    state: Mapping[str, Any], path: str | os.PathLike[str], *, root_rank: int = 0
) -> Path | None:
    """Write ``state`` with ``torch.save`` on ``root_rank`` only; returns the path there, None elsewhere.

    The file is replaced atomically and durably (a crash mid-write leaves the previous checkpoint intact),
    with the permissions a plain ``open()`` would give it (0o666 less the umask). Every rank returns only
    after the file exists; if writing fails, every rank raises :class:`CollectivesError` (on the root with
    the original exception as its cause), so the ranks stay in step.
    """
    ctx = context._require("save_checkpoint")
    from collectives.objects import broadcast_object

    target = Path(path)
    failure: Exception | None = None
    if ctx.topology.rank == root_rank:
        try:
            _write_atomically(state, target)
        except Exception as exc:
            failure = exc
    # Also the synchronisation point: the other ranks wait here until the root has written (or failed).
    outcome = broadcast_object(None if failure is None else f"{type(failure).__name__}: {failure}", root_rank)
    if outcome is not None:
        message = f"save_checkpoint({str(target)!r}) failed on rank {root_rank}: {outcome}"
        raise CollectivesError(message) from failure
    if ctx.topology.rank != root_rank:
        return None
    _log.info("checkpoint written to %s", target)
    return target


def _umask() -> int:
    # os.umask() reads the mask only by setting it, which races with other threads creating files meanwhile;
    # Linux shows the mask in /proc without touching it.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomically(state: Mapping[str, Any], target: Path) -> None:
    import torch

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        # mkstemp creates the file 0600; a checkpoint should be as readable as any file the user writes.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            torch.save(dict(state), handle)
            handle.flush()
            # Data on disk before the rename, or a power loss could leave a renamed but empty file.
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    # The rename itself lives in the directory, which must reach the disk too.
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
    from collectives.objects import broadcast_object

    state: dict[str, Any] | None = None
    if ctx.topology.rank == root_rank:
        target = Path(path)
        if target.exists():
            import torch

            state = torch.load(target, map_location="cpu", weights_only=weights_only)
            _log.info("checkpoint loaded from %s", target)
    return broadcast_object(state, root_rank)
