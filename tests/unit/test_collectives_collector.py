"""``collectives.collector``: init()'s collection and freeze, and the two ways it is left out."""

from __future__ import annotations

import gc
import weakref

import pytest

from collectives.collector import FREEZE_VAR, freeze_long_lived

pytestmark = pytest.mark.usefixtures("collector_as_it_was")


def test_it_collects_then_freezes_what_exists() -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    garbage = weakref.ref(Cycle())  # a cycle, garbage already: collected, not frozen for good
    assert garbage() is not None
    assert freeze_long_lived({}) is True
    assert gc.get_freeze_count() > 0
    assert garbage() is None


@pytest.mark.parametrize("value", ["0", " 0\n"])
def test_the_variable_at_0_leaves_the_collector_alone(value: str) -> None:
    assert freeze_long_lived({FREEZE_VAR: value}) is False
    assert gc.get_freeze_count() == 0


def test_a_collector_the_script_disabled_is_left_alone() -> None:
    gc.disable()
    assert freeze_long_lived({}) is False
    assert gc.get_freeze_count() == 0
