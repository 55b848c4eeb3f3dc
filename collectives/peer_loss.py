"""What a rank does once its engine has seen a peer go: abort the process set's NCCL communicator, so that
collectives already issued on the GPU end instead of waiting for the dead peer (``collectives.engine``)."""

from __future__ import annotations

import logging

from collectives.registry import _Groups

__all__ = ["abort_nccl"]

_log = logging.getLogger("collectives")


def abort_nccl(groups: _Groups) -> None:
    """The engine's rounds failed (a peer is gone, which its idle rounds see within a cycle): abort the set's
    NCCL communicator. A collective already issued there waits on the GPU for the dead peer, and so does
    everything that synchronises with its stream (``.item()``, the optimizer's step) until NCCL's own timeout;
    the abort ends it now. gloo's sockets fail on their own."""
    import torch.distributed as dist

    try:
        group = groups.data if groups.data is not None else dist.distributed_c10d._get_default_group()
        if dist.get_backend(group) != "nccl":
            return
        _log.warning("process set %d: a peer is gone; aborting its NCCL communicator", groups.set_id)
        group.abort()
    except Exception as error:  # the group is gone already (a reset or shutdown got there first)
        _log.debug("process set %d: no NCCL communicator to abort: %s", groups.set_id, error)
