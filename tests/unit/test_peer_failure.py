"""Which errors a rank under ``hvd.elastic.run`` takes for a lost peer (collectives.elastic.failures): the
transport's, and after the agent's notice whatever torch.distributed or collectives raise, but never the
script's own RuntimeError, which stays that rank's failure (Horovod's all-ranks-failure scenario)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist

from collectives.elastic.failures import is_peer_failure

LIBRARY = Path(__file__).resolve().parents[2] / "collectives" / "ops" / "somewhere.py"
DISTRIBUTED = Path(dist.__file__).resolve().parent / "somewhere.py"


def _raised_in(path: Path, message: str = "boom") -> RuntimeError:
    """A RuntimeError whose innermost frame is in `path` (compiled under that name)."""
    try:
        exec(compile(f"raise RuntimeError({message!r})", str(path), "exec"))
    except RuntimeError as error:
        return error
    raise AssertionError("unreachable")


def _raised_here(message: str = "start rank 2 fails at batch 1") -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as error:
        return error


def _raised_from(inner: RuntimeError) -> RuntimeError:
    try:
        raise RuntimeError("the step failed") from inner
    except RuntimeError as error:
        return error


@pytest.mark.parametrize(
    ("make", "peer_lost", "expected"),
    [
        (_raised_here, True, False),  # the script's own error, after the notice
        (_raised_here, False, False),
        (lambda: _raised_in(LIBRARY), True, True),  # a collective failing after the notice
        (lambda: _raised_in(DISTRIBUTED), True, True),
        (lambda: _raised_in(LIBRARY), False, False),  # before it: only a transport's message says so
        (lambda: _raised_in(DISTRIBUTED, "Connection closed by peer [10.0.0.2]:1234"), False, True),
        (lambda: _raised_here("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), False, True),
        (lambda: _raised_from(_raised_in(DISTRIBUTED)), True, True),  # the script re-raised a collective's
        (lambda: _raised_from(_raised_here()), True, False),
        (lambda: dist.DistError("store lost"), False, True),
        (lambda: ValueError("not a RuntimeError"), True, False),
        (lambda: RuntimeError("never raised: no traceback"), True, False),
    ],
)
def test_peer_failure(make: Callable[[], BaseException], peer_lost: bool, expected: bool) -> None:
    assert is_peer_failure(make(), peer_lost) is expected
