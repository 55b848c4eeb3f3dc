"""A process group formed after a creation that failed takes the name its peers' first group takes: torch
names groups by a count that only destroying the default group resets, and a group's peers meet under its
name. An elastic reset's new world that lost a peer before it formed left a survivor one count up, and its
next world, with a newcomer (whose first group is "0"), waited forever (collectives.context)."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from collectives import context

SECOND = datetime.timedelta(seconds=1)


def test_a_group_formed_after_a_failed_creation_takes_a_first_groups_name() -> None:
    lonely = dist.HashStore()  # type: ignore[attr-defined]
    lonely.set_timeout(SECOND)
    with pytest.raises(dist.DistStoreError):
        # A world of two whose other rank never comes: its creation fails, counting a name up.
        context._init_process_group(backend="gloo", store=lonely, rank=0, world_size=2, timeout=SECOND)
    assert not dist.is_initialized()
    store = dist.HashStore()  # type: ignore[attr-defined]
    context._init_process_group(backend="gloo", store=store, rank=0, world_size=1, timeout=SECOND)
    try:
        assert dist.distributed_c10d._get_default_group().group_name == "0"
    finally:
        dist.destroy_process_group()
