"""A peer's death seen by the engine: the set's NCCL communicator is aborted (gloo needs nothing), and a GPU
operation synchronized after the failure raises Horovod's error (``collectives.peer_loss``, the engine's
ticket, the handle). The flow itself, with real ranks: tests/integration/test_collectives_engine.py (gloo)
and tests/gpu/test_nccl_peer_death.py (NCCL, two GPUs)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from collectives import peer_loss, registry  # noqa: E402
from collectives.engine import Ticket  # noqa: E402
from collectives.errors import HorovodInternalError  # noqa: E402
from collectives.ops import _handle  # noqa: E402
from collectives.registry import _Groups  # noqa: E402


class _Group:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


@pytest.fixture
def data_group(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(group: Any) -> _Groups:
        monkeypatch.setitem(registry._process_groups, 7, (group, None, None))
        return _Groups(7, (0, 1), 0)

    def backend(group: Any) -> str:
        if not isinstance(group, _Group):
            raise ValueError("Invalid process group specified")
        return group.backend

    monkeypatch.setattr(torch.distributed, "get_backend", backend)
    return install


def test_the_nccl_communicator_is_aborted_once_the_engine_fails(data_group: Any) -> None:
    group = _Group("nccl")
    peer_loss.abort_nccl(data_group(group))
    assert group.aborted == 1


def test_gloo_is_left_to_fail_on_its_own(data_group: Any) -> None:
    group = _Group("gloo")
    peer_loss.abort_nccl(data_group(group))
    assert group.aborted == 0


def test_a_group_already_gone_is_no_error(data_group: Any) -> None:
    peer_loss.abort_nccl(data_group(object()))


class _Engine:
    broken: HorovodInternalError | None = None


def test_a_gpu_result_synchronized_after_the_failure_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _Engine()
    ticket = Ticket(engine)  # type: ignore[arg-type]
    result = [torch.ones(2)]
    _handle._raise_if_cut_short(ticket, result)  # nothing failed: the result stands
    engine.broken = HorovodInternalError("a peer is gone")
    _handle._raise_if_cut_short(ticket, result)  # on the CPU the transport's own error is the truth
    assert not _handle._on_gpu((torch.ones(1), [torch.zeros(1)]))
    monkeypatch.setattr(_handle, "_on_gpu", lambda _: True)
    with pytest.raises(HorovodInternalError, match="a peer is gone"):
        _handle._raise_if_cut_short(ticket, result)
