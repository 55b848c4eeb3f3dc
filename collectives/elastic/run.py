"""``hvd.elastic.run``: run the training function until it returns, rolling back to the last commit when a
peer fails and going on in a new world (same process) after every reset."""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from collectives import links
from collectives.elastic import joining
from collectives.elastic.channel import Channel, open_channel
from collectives.elastic.failures import is_peer_failure, stop_engine
from collectives.elastic.state import State
from collectives.errors import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run"]

T = TypeVar("T")
_log = logging.getLogger(__name__)


def _abort_on_peer_lost() -> None:
    """Called on the channel's thread when the agent says a peer is gone: every wait on the old world must end
    now, not at the group's timeout (a peer whose link was cut never answers, and nothing wakes a gloo wait).
    The groups' TCP connections are shut down (``collectives.links``), so each blocked or later collective
    fails with gloo's "Connection closed by peer" on every thread; NCCL's communicators are aborted."""
    import torch.distributed as dist

    from collectives import context

    cut = links.cut()
    _log.info("a peer is lost: %d connection(s) of the old world shut down", cut)
    current = context._context
    if current is not None and current.device_type == "cuda" and dist.is_initialized():
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Horovod's decorator: ``func(state, ...)`` is run, after a sync of ``state`` from rank 0, until it
    returns. HorovodInternalError (or a collective failing because a peer is gone) restores the last commit;
    HostsUpdatedInterrupt keeps the state. Either way the rank waits for its new world, joins it in this
    process, runs the reset callbacks, and goes on. Without distrun's elastic mode a failure is raised."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        joining.entered()
        channel = open_channel(_abort_on_peer_lost)
        if channel is not None:
            channel.listen(state.on_hosts_updated)
        skip_sync = False
        reset_at: float | None = None  # when this rank stopped for the reset under way
        try:
            while True:
                try:
                    if reset_at is not None:
                        assert channel is not None
                        # A peer of the new world may die before it forms: that fails here as in training,
                        # and this rank reports at its commit again for the next world.
                        _reset(channel)
                        state.on_reset()
                    if not skip_sync:
                        state.sync()
                    if reset_at is not None and channel is not None:
                        channel.send("synced", seconds=time.monotonic() - reset_at)
                        reset_at = None
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as interrupt:
                    skip_sync = interrupt.skip_sync
                except RuntimeError as error:
                    if channel is None or not is_peer_failure(error, channel.peer_lost.is_set()):
                        raise
                    state.restore()
                    skip_sync = False
                if channel is None:
                    raise HorovodInternalError("a reset needs distrun's elastic mode (distrun --min-np ...)")
                if reset_at is None:
                    reset_at = time.monotonic()
        finally:
            if channel is not None:
                channel.forget(state.on_hosts_updated)

    return wrapper


def _reset(channel: Channel) -> None:
    """Leave the old world and join the one the agent names; a rank that is not in it exits cleanly."""
    from collectives import context

    stop_engine()
    channel.send("ready")
    world = channel.next_world()
    if world.env is None:
        context.abandon()
        sys.exit(0)
    os.environ.update(world.env)
    context.reinit(os.environ)
    from collectives import coordination

    # Each DistributedOptimizer's divisor and layout were made for the old world.
    for optimizer in list(coordination.joinable_optimizers.values()):
        optimizer._rejoin()
