"""The engine's round table (collectives.engine_rounds): names key identically in every process, an
operation is ready once every rank has announced it, and the stall check names who is missing what; a round
carries a small payload, a burst in one gather without payloads, and what overflows in a second gather."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest
import torch

from collectives import engine_rounds
from collectives.engine_announce import Announcement, name_key, payload_fits
from collectives.engine_reports import StallCheck, failure_message, stall_texts
from collectives.engine_rounds import Table
from collectives.negotiation import ROW, Call, Kind, row_of
from collectives.reduce_op import ReduceOp


def test_a_name_keys_the_same_in_another_process_and_never_as_an_ordered_entry() -> None:
    other = subprocess.run(
        [sys.executable, "-c", "from collectives.engine_announce import name_key; print(name_key('grad.w'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(other.stdout) == name_key("grad.w")
    assert name_key("grad.w") != name_key("grad.b")
    assert all(name_key(n) > 0 for n in ("", "a", "x" * 1000))


def test_ready_once_every_rank_has_announced_and_rows_come_back_in_set_order() -> None:
    table = Table(3)
    key = name_key("op")
    assert not table.add(2, key, [2])
    assert not table.add(0, key, [0])
    assert table.add(1, key, [1])
    assert table.take(key) == [[0], [1], [2]]
    assert table.rows == {}


def test_the_stall_check_names_the_ranks_missing_each_operation() -> None:
    table = Table(3)
    key = name_key("lonely")
    table.labels[key] = "lonely"
    table.add(0, key, [0])
    table.add(2, key, [0])
    assert table.stalled(60.0, (4, 5, 6)) == {}
    assert table.stalled(0.0, (4, 5, 6)) == {5: ["lonely"]}


def test_the_stall_is_logged_by_its_first_submitter_which_knows_the_name() -> None:
    """Rounds carry keys, not names: rank 5 (position 1) never submitted `only_me`, so only position 2, its
    first and only submitter, names it; the others' text says whose operation it is."""
    table = Table(3)
    key = name_key("only_me")
    table.add(2, key, [0])
    assert table.stalled(0.0, (4, 5, 6)) == {4: ["an operation of rank 6"], 5: ["an operation of rank 6"]}
    assert table.stalled(0.0, (4, 5, 6), reporter=0) == {}
    table.labels[key] = "only_me"  # as on the submitter
    assert stall_texts(table, 0.0, (4, 5, 6), 2) == (
        "rank 4 missing ['only_me']; rank 5 missing ['only_me']",
        "rank 4 missing ['only_me']; rank 5 missing ['only_me']",
    )
    assert stall_texts(table, 0.0, (4, 5, 6), 0)[1] == ""
    assert stall_texts(table, 60.0, (4, 5, 6), 2) == ("", "")


def test_the_stall_check_runs_once_a_period_and_says_when_its_finding_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = Table(3)
    key = name_key("only_me")
    table.add(2, key, [0])
    table.labels[key] = "only_me"
    missing = "rank 4 missing ['only_me']; rank 5 missing ['only_me']"
    assert not StallCheck(0, False, 0.0, now=0.0).run(table, (4, 5, 6), 2, now=1.0)  # disabled
    waiting = StallCheck(0, True, 60.0, now=0.0)
    assert not waiting.run(table, (4, 5, 6), 2, now=30.0) and waiting.text == ""  # not a period yet
    check = StallCheck(0, True, 0.0, now=0.0)
    with caplog.at_level("WARNING", logger="collectives"):
        assert check.run(table, (4, 5, 6), 2, now=1.0) and check.text == missing
        assert not check.run(table, (4, 5, 6), 2, now=2.0) and check.text == missing
    assert [r.getMessage().endswith(missing) for r in caplog.records] == [True, True]  # every period
    table.add(0, key, [0])
    assert table.add(1, key, [0])  # every rank has it now
    table.take(key)
    assert check.run(table, (4, 5, 6), 2, now=3.0) and check.text == ""


def test_a_round_that_fails_after_a_peer_left_cleanly_says_so() -> None:
    error = RuntimeError("Connection closed by peer (typically caused by a remote worker crashing)")
    assert failure_message(0, error, [0], ["only_me", "only_me"]) == (
        "process set 0: rank 0 shut down collectives (the script ended or called shutdown()) while this rank "
        "waited for ['only_me']; the connection closed (RuntimeError)"
    )
    assert "ranks [1, 2] shut down" in failure_message(3, error, [1, 2], [])
    assert failure_message(0, error, [], ["x"]).startswith(
        "process set 0: a collective failed (RuntimeError:"
    )


def _round(
    monkeypatch: pytest.MonkeyPatch,
    mine: list[Announcement],
    table: Table | None = None,
    other_wants: int = 0,
) -> tuple[Table, list[int], list[int]]:
    """One round of two ranks that announce the same operations (each gather gives this rank's buffer
    twice; ``other_wants``: the other rank's header asks for that first buffer length); the table, the ready
    keys and the length of each all_gather's buffer."""
    gathers: list[int] = []

    def gather(buffer: torch.Tensor, out: torch.Tensor, group: object, timeout: object) -> None:
        gathers.append(buffer.numel())
        out.copy_(buffer.repeat(2))
        if other_wants and len(gathers) == 1:
            out[buffer.numel() + 6] = other_wants  # the other rank's header: the length it wanted

    monkeypatch.setattr(engine_rounds, "_gather", gather)
    table = Table(2) if table is None else table
    timeout = datetime.timedelta(seconds=5)
    result = engine_rounds.exchange(table, mine, stop=False, group=None, timeout=timeout, width=1 + ROW)
    return table, result.ready, gathers


def _announce(i: int, tensor: torch.Tensor) -> Announcement:
    call = Call(Kind.ALLREDUCE, f"t.{i}", tensor.dtype, "cpu", ReduceOp.SUM, shape=tuple(tensor.shape))
    return Announcement(name_key(f"t.{i}"), row_of(call), f"t.{i}", tensor)


def test_a_small_payload_rides_in_the_round_and_rows_come_back_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    tensor = torch.arange(6, dtype=torch.float64).view(2, 3)
    table, ready, gathers = _round(monkeypatch, [_announce(0, tensor)])
    key = name_key("t.0")
    assert ready == [key] and len(gathers) == 1
    payloads = table.take_payloads(key)
    assert payloads is not None and len(payloads) == 2
    assert all(torch.equal(p.view(torch.float64).view(2, 3), tensor) for p in payloads)
    full = Call(Kind.ALLREDUCE, "t.0", torch.float64, "cpu", ReduceOp.SUM, shape=(2, 3)).row()
    assert table.take(key) == [full, full]


def test_payloads_not_yet_taken_outlive_the_next_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's buffers are kept for the next round, unless its payloads (views of what it received) are
    still held: then the next round gathers into another buffer, and the payloads keep their bytes."""
    table, ready, _ = _round(monkeypatch, [_announce(0, torch.full((4,), 7.0))])
    assert ready == [name_key("t.0")]
    held = table.buffers()[1]
    _round(monkeypatch, [_announce(1, torch.full((4,), -1.0))], table)
    _round(monkeypatch, [], table)
    payloads = table.take_payloads(name_key("t.0"))
    assert payloads is not None
    assert all(torch.equal(p.view(torch.float32), torch.full((4,), 7.0)) for p in payloads)
    assert table.buffers()[1] is not held
    quiet = table.buffers()
    _round(monkeypatch, [], table)
    assert table.buffers() == quiet  # rounds without payloads gather into the same buffers


def test_a_burst_too_large_to_carry_goes_without_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = [_announce(i, torch.zeros(256)) for i in range(64)]
    table, ready, gathers = _round(monkeypatch, mine)
    assert ready == [a.key for a in mine] and len(gathers) == 1
    assert all(table.take_payloads(a.key) is None for a in mine)


def test_what_the_first_buffer_cannot_hold_takes_a_second_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = [_announce(i, torch.zeros(2)) for i in range(200)]
    table, ready, gathers = _round(monkeypatch, mine)
    assert ready == [a.key for a in mine] and len(gathers) == 2
    last = Call(Kind.ALLREDUCE, "t.199", torch.float32, "cpu", ReduceOp.SUM, shape=(2,)).row()
    assert table.take(mine[-1].key) == [last, last]


def test_a_payload_too_long_for_the_first_buffer_rides_from_the_next_round_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tensor = torch.arange(
        16384, dtype=torch.float32
    )  # 64 KB: over the first buffer at rest, within the limit
    rest = engine_rounds.first_words(2)
    table, ready, gathers = _round(monkeypatch, [_announce(0, tensor)])
    assert ready and table.take_payloads(ready[0]) is None and gathers == [rest]
    table.take(ready[0])
    assert table.words > 16384 // 2  # the payload in words, and its record
    grown = table.words
    table, ready, gathers = _round(monkeypatch, [_announce(0, tensor)], table)
    payloads = table.take_payloads(ready[0])
    assert gathers == [grown] and payloads is not None
    assert all(torch.equal(p.view(torch.float32), tensor) for p in payloads)
    table.take(ready[0])
    # Rounds with nothing to carry: the buffer keeps its length a while, then is back at rest.
    lengths = []
    for _ in range(engine_rounds._GROWN_ROUNDS):
        table, _, gathers = _round(monkeypatch, [], table)
        lengths.append(gathers[0])
    assert lengths[0] == grown and table.words == rest


def test_the_first_buffer_follows_the_longest_any_rank_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    table, _, _ = _round(monkeypatch, [], other_wants=5000)
    assert table.words == 5000
    table, _, _ = _round(monkeypatch, [], table, other_wants=10**9)
    assert table.words == table.most_words  # capped: every rank receives every rank's buffer


def test_a_payload_beyond_the_limit_never_rides() -> None:
    assert payload_fits(64 * 1024, 4)
    assert not payload_fits(1 << 20, 2)
