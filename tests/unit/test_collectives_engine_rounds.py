"""The engine's round table (collectives.engine_rounds): names key identically in every process, an
operation is ready once every rank has announced it, and the stall check names who is missing what."""

from __future__ import annotations

import subprocess
import sys

from collectives.engine_rounds import Table, name_key


def test_a_name_keys_the_same_in_another_process_and_never_as_an_ordered_entry() -> None:
    other = subprocess.run(
        [sys.executable, "-c", "from collectives.engine_rounds import name_key; print(name_key('grad.w'))"],
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
