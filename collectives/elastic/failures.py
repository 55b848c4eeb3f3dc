"""Which errors mean "a peer of the world is gone": those become HorovodInternalError under
``hvd.elastic.run`` (pure, apart from the engine hook)."""

from __future__ import annotations

import sys
from pathlib import Path

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
    """True for an error of torch.distributed's (by type or transport message); once the agent said a peer is
    gone, any RuntimeError raised inside torch.distributed or this library (what a collective raises then is
    whatever the transport says). A RuntimeError the script raises itself stays the script's failure, as under
    Horovod: taking it for a peer's would keep a failed rank in the world (Horovod's all-ranks-failure
    scenario, its failures seconds apart, would reset instead of ending)."""
    distributed = sys.modules.get("torch.distributed")
    dist_error = getattr(distributed, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    if not isinstance(error, RuntimeError):
        return False
    if any(marker in str(error) for marker in _MARKERS):
        return True
    return peer_lost and any(_raised_in_library(link) for link in _chain(error))


def _chain(error: BaseException) -> list[BaseException]:
    """The error and those it was raised from or while handling, each once."""
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and all(link is not other for other in seen):
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def _raised_in_library(error: BaseException) -> bool:
    """Whether the error's innermost Python frame is in torch.distributed or in this library."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = Path(tb.tb_frame.f_code.co_filename).resolve()
    distributed = getattr(sys.modules.get("torch.distributed"), "__file__", None)
    roots = [_LIBRARY, *([Path(distributed).resolve().parent] if distributed else [])]
    return any(where.is_relative_to(root) for root in roots)


_LIBRARY = Path(__file__).resolve().parents[1]  # the collectives package


def stop_engine() -> None:
    """Fail the background engines' pending handles and stop their threads before the group goes: the one
    place a reset reaches the engine (``collectives.engines.reset_engines``). Looked up among the loaded
    modules, not imported: a process that never ran a collective has no engine to stop."""
    engine = sys.modules.get("collectives.engines")
    reset = getattr(engine, "reset_engines", None) if engine is not None else None
    if callable(reset):
        reset()
