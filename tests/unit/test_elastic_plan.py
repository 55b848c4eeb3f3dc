"""An elastic reset's new world (launcher.core.elastic_plan): survivors keep the low ranks in their old order,
newcomers come last, and each rank's new identity is torchrun's and horovodrun's for its new place."""

from __future__ import annotations

import pytest

from launcher.core.elastic_plan import Member, new_world, reset_envs
from launcher.core.hosts import Host

A, B, C = Host("a", 2), Host("b", 2), Host("c", 1)


@pytest.mark.parametrize(
    ("survivors", "newcomers", "places"),
    [
        # rank id, host -> (rank, local rank, node rank)
        ([(0, A), (1, A)], [], {0: (0, 0, 0), 1: (1, 1, 0)}),
        ([(1, A), (2, B), (3, B)], [], {1: (0, 0, 0), 2: (1, 0, 1), 3: (2, 1, 1)}),
        ([(2, B), (0, A)], [(5, C)], {2: (0, 0, 0), 0: (1, 0, 1), 5: (2, 0, 2)}),
        ([(0, A)], [(4, A), (6, B)], {0: (0, 0, 0), 4: (1, 1, 0), 6: (2, 0, 1)}),
    ],
)
def test_survivors_keep_the_low_ranks_in_order_and_newcomers_come_last(
    survivors: list[tuple[int, Host]], newcomers: list[tuple[int, Host]], places: dict[int, tuple[int, ...]]
) -> None:
    world = new_world([Member(*m) for m in survivors], [Member(*m) for m in newcomers])
    pairs = zip(world.members, world.plan.slots, strict=True)
    got = {m.rank_id: (s.rank, s.local_rank, s.node_rank) for m, s in pairs}
    assert got == places
    assert world.rank0_host == survivors[0][1]
    assert all(world.rank_of(rank_id) == place[0] for rank_id, place in places.items())


def test_each_rank_gets_its_new_identity_and_the_new_rendezvous() -> None:
    world = new_world([Member(1, A), Member(2, B), Member(3, B)])
    envs = reset_envs(world, master_addr="10.0.0.1", master_port=2345, run_id="r", resets=1, max_restarts=3)
    assert set(envs) == {1, 2, 3}
    table = {
        rank_id: (
            env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"],
            env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"],
            env["HOROVOD_HOSTNAME"],
        )
        for rank_id, env in envs.items()
    }  # fmt: skip
    assert table == {
        1: ("0", "3", "0", "1", "0", "0", "3", "0", "2", "a"),
        2: ("1", "3", "0", "2", "1", "1", "3", "1", "2", "b"),
        3: ("2", "3", "1", "2", "1", "2", "3", "0", "1", "b"),
    }
    for env in envs.values():
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["DISTRUN_RESTART_COUNT"]) == (
            "10.0.0.1",
            "2345",
            "1",
        )
        assert "TF_CONFIG" not in env
