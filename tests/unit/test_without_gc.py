"""``launcher.without_gc``: distrun's imports run without the garbage collector, and what they made is left
out of its later passes."""

from __future__ import annotations

import gc
import sys

import pytest

from launcher import without_gc

pytestmark = pytest.mark.usefixtures("collector_as_it_was")


def test_no_pass_runs_inside_and_what_was_made_is_frozen_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/distrun", "-np", "2", "train.py"])
    passes: list[str] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(phase)

    gc.enable()
    gc.unfreeze()
    gc.callbacks.append(count)
    try:
        with without_gc():
            assert not gc.isenabled()
            made = [[index] for index in range(50_000)]  # would bring dozens of young passes
            inside = len(passes)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(count)
    assert inside == 0
    assert gc.get_freeze_count() >= len(made)
    walked = {id(obj) for obj in gc.get_objects()}  # what the collector's passes walk, every generation
    assert id(made) not in walked and id(made[0]) not in walked


def test_a_program_running_the_cli_in_process_keeps_its_objects_collectable() -> None:
    gc.enable()
    gc.unfreeze()
    with without_gc():
        made = [[index] for index in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert any(obj is made for obj in gc.get_objects())
