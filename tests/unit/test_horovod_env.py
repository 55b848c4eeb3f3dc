"""horovodrun's rank variables: Horovod's cross rank and size count the hosts with a rank at the same local
rank (its get_host_assignments), and collectives reads them back."""

from __future__ import annotations

import pytest

from collectives.context import topology_from_env
from launcher.core.env import HOROVOD_NAMES, horovod_env, parse_exports
from launcher.core.hosts import Host
from launcher.core.plan import make_plan
from launcher.errors import UsageError

UNEVEN = make_plan([Host("a", 2), Host("b", 1)], 3)


def test_cross_counts_the_hosts_with_a_rank_at_the_same_local_rank() -> None:
    assert [horovod_env(slot, UNEVEN) for slot in UNEVEN.slots] == [
        dict(zip(HOROVOD_NAMES, ("0", "3", "0", "2", "0", "2", "a"), strict=True)),
        dict(zip(HOROVOD_NAMES, ("1", "3", "1", "2", "0", "1", "a"), strict=True)),
        dict(zip(HOROVOD_NAMES, ("2", "3", "0", "1", "1", "2", "b"), strict=True)),
    ]


def test_even_hosts_have_every_host_in_each_cross_group() -> None:
    plan = make_plan([Host("a", 2), Host("b", 2), Host("c", 2)], 6)
    crosses = [plan.horovod_cross(slot) for slot in plan.slots]
    assert crosses == [(0, 3), (0, 3), (1, 3), (1, 3), (2, 3), (2, 3)]


def test_collectives_reads_horovods_cross_values() -> None:
    env = {
        "RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "CROSS_RANK": "0",
        "CROSS_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1", "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "1",
    }  # fmt: skip
    topology = topology_from_env(env)
    assert (topology.cross_rank, topology.cross_size) == (0, 1)
    del env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]
    assert topology_from_env(env).cross_size == 2


def test_the_horovod_identity_is_distruns_own() -> None:
    with pytest.raises(UsageError, match="distrun sets HOROVOD_RANK"):
        parse_exports(["HOROVOD_RANK=3"], {})
