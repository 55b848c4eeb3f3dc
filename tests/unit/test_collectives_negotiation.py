"""The negotiation's verdicts, from rows as ranks would send them: no processes needed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from collectives.errors import MismatchError  # noqa: E402
from collectives.negotiation import Call, Kind, _verdict  # noqa: E402
from collectives.reduce_op import ReduceOp  # noqa: E402
from collectives.registry import _Groups  # noqa: E402

# A process set of ranks 3 and 5: not the global set, so join handling stays out of these verdicts.
GROUPS = _Groups(99, (3, 5), index=0)


def verdict(mine: Call, other: Call) -> str:
    with pytest.raises(MismatchError) as caught:
        _verdict(mine, GROUPS, [mine.row(), other.row()])
    return str(caught.value)


def allreduce(**fields: object) -> Call:
    base: dict[str, object] = {
        "kind": Kind.ALLREDUCE,
        "dtype": torch.float32,
        "op": ReduceOp.AVERAGE,
        "shape": (17, 17),
    }
    return Call(**{**base, **fields})  # type: ignore[arg-type]


def test_equal_rows_agree_and_keep_the_per_rank_facts() -> None:
    mine = Call(Kind.ALLGATHER, dtype=torch.float32, shape=(4,), free=(2,))
    other = Call(Kind.ALLGATHER, dtype=torch.float32, shape=(4,), free=(7,))
    agreement = _verdict(mine, GROUPS, [mine.row(), other.row()])
    assert agreement.joined == ()
    assert [agreement.free(i)[0] for i in range(2)] == [2, 7]


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        (allreduce(shape=(18, 18)), "Mismatched allreduce tensor shapes: rank 3: [17, 17], rank 5: [18, 18]"),
        (allreduce(shape=(289,)), "Mismatched allreduce tensor shapes: rank 3: [17, 17], rank 5: [289]"),
        (allreduce(dtype=torch.int32), "Mismatched allreduce data types: rank 3: float32, rank 5: int32"),
        (allreduce(op=ReduceOp.SUM), "Mismatched allreduce reduction ops: rank 3: AVERAGE, rank 5: SUM"),
        (allreduce(name="grad.w"), "Mismatched allreduce names"),
        (allreduce(device="cuda"), "Mismatched allreduce devices: rank 3: cpu, rank 5: cuda"),
        (
            Call(Kind.BARRIER),
            "Mismatched collective operations: ranks called different collectives "
            "(rank 3: allreduce, rank 5: barrier)",
        ),
    ],
)
def test_a_mismatch_names_the_field_and_every_ranks_value(other: Call, expected: str) -> None:
    assert expected in verdict(allreduce(), other)


def test_roots_and_allgather_trailing_dimensions() -> None:
    root = Call(Kind.BROADCAST, dtype=torch.float32, shape=(3,), root=3)
    assert "root ranks: rank 3: 3, rank 5: 5" in verdict(root, Call(**{**root.__dict__, "root": 5}))
    gather = Call(Kind.ALLGATHER, dtype=torch.float32, shape=(4,), free=(1,))
    message = verdict(gather, Call(Kind.ALLGATHER, dtype=torch.float32, shape=(5,), free=(1,)))
    assert "allgather trailing dimensions: rank 3: [4], rank 5: [5]" in message


def test_the_verdict_is_the_same_on_both_sides() -> None:
    a, b = allreduce(), allreduce(shape=(3,))
    here = verdict(a, b)
    there = _Groups(99, GROUPS.ranks, index=1)
    with pytest.raises(MismatchError) as caught:
        _verdict(b, there, [a.row(), b.row()])
    assert str(caught.value) == here


def test_after_a_reset_a_mismatch_says_which_elastic_pattern_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    broadcast = Call(Kind.BROADCAST, dtype=torch.float32, shape=(3,), root=0)
    other = Call(Kind.BROADCAST, dtype=torch.float32, shape=(4,), root=0)
    assert "hvd.elastic.run syncs" not in verdict(broadcast, other), "no reset: no hint"
    monkeypatch.setenv("DISTRUN_ELASTIC_SOCKET", "/tmp/elastic.sock")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    message = verdict(broadcast, other)
    assert message.startswith("Mismatched broadcast tensor shapes")
    assert "Fix: remove the top-level hvd.broadcast_parameters/broadcast_optimizer_state calls" in message
