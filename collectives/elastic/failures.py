"""Which errors mean "a peer of the world is gone": those become HorovodInternalError under
``hvd.elastic.run`` (pure, apart from the engine hook)."""

from __future__ import annotations

import sys

__all__ = ["is_peer_failure", "stop_engine"]

# What torch's transports say when the other end of a collective vanished or stopped answering: gloo's pair
# errors, NCCL's remote errors and aborts, the store's lost connections, and the group's timeout.
_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo/transport",
    "NCCL communicator was aborted",
    "NCCL error",
    "ncclRemoteError",
    "ncclSystemError",
    "Timed out waiting",
    "timed out",
    "Socket Timeout",
    "Connection refused",
    "failed to recv",
    "process group has been destroyed",
)


def is_peer_failure(error: BaseException, peer_lost: bool) -> bool:
    """True for an error of torch.distributed's (by type or transport message); any RuntimeError once the
    agent said a peer is gone (what a collective raises then is whatever the transport says)."""
    distributed = sys.modules.get("torch.distributed")
    dist_error = getattr(distributed, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    if not isinstance(error, RuntimeError):
        return False
    return peer_lost or any(marker in str(error) for marker in _MARKERS)


def stop_engine() -> None:
    """Fail the background engines' pending handles and stop their threads before the group goes: the one
    place a reset reaches the engine (``collectives.engines.reset_engines``). Looked up among the loaded
    modules, not imported: a process that never ran a collective has no engine to stop."""
    engine = sys.modules.get("collectives.engines")
    reset = getattr(engine, "reset_engines", None) if engine is not None else None
    if callable(reset):
        reset()
