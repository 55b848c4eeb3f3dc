"""Pure helpers of collectives (environment parsing, LR scaling, warm-up, sharding, bench arithmetic)."""

from __future__ import annotations

import importlib
import itertools
import math

import pytest

import collectives
from collectives.context import Topology, _placement_from_hostnames, topology_from_env
from collectives.data import ShardSampler, shard_indices
from collectives.errors import CollectivesError, EnvironmentContractError, NotInitializedError, ShardingError
from collectives.lr import WarmupSchedule, scale_lr
from tests.support import REPO


def test_every_public_name_resolves() -> None:
    for name in collectives.__all__:
        assert getattr(collectives, name) is not None, name
    with pytest.raises(AttributeError):
        _ = collectives.no_such_name


def test_lazy_table_matches_every_module_all() -> None:
    # __init__.pyi re-exports each module's __all__ for type checkers; the runtime table must agree with it.
    modules = set(collectives._LAZY.values())
    for module in modules:
        exported = set(importlib.import_module(f"collectives.{module}").__all__)
        assert exported == {n for n, m in collectives._LAZY.items() if m == module}, module
    stub = (REPO / "collectives" / "__init__.pyi").read_text()
    assert {
        line.split()[1].removeprefix("collectives.") for line in stub.splitlines() if line.startswith("from ")
    } == modules


def test_ops_before_init_raise_a_clear_error() -> None:
    assert not collectives.is_initialized()
    with pytest.raises(NotInitializedError, match=r"collectives.rank\(\) needs the process group.*init\(\)"):
        collectives.rank()
    with pytest.raises(NotInitializedError, match=r"collectives\.init\(\)"):
        collectives.barrier()


DISTRUN_ENV = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "LOCAL_SIZE": "4",
    "CROSS_RANK": "1",
    "CROSS_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_no_environment_means_single_process() -> None:
    assert topology_from_env({}) == Topology(0, 1, 0, 1, 0, 1)


def test_distrun_environment() -> None:
    assert topology_from_env(DISTRUN_ENV) == Topology(5, 8, 1, 4, 1, 2, "10.0.0.1", 29500)


def test_torchrun_environment_uses_fallback_names() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
    }
    assert topology_from_env(env) == Topology(3, 4, 1, 2, 1, 2, "127.0.0.1", 1234)


def test_minimal_environment_derives_local_and_cross_values() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert topology_from_env(env) == Topology(2, 3, 2, 3, 0, 1, "h", 1)
    env = {**env, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2"}
    assert topology_from_env(env) == Topology(3, 4, 1, 2, 1, 2, "h", 1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0"}, "RANK and WORLD_SIZE must be set together"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT"),
        ({**DISTRUN_ENV, "RANK": "8"}, r"RANK must be in \[0, WORLD_SIZE\)"),
        ({**DISTRUN_ENV, "LOCAL_RANK": "4"}, "LOCAL_RANK must be in"),
        ({k: v for k, v in DISTRUN_ENV.items() if not k.startswith("LOCAL")}, "LOCAL_SIZE .* must be set"),
    ],
)
def test_bad_environment_is_reported(env: dict[str, str], message: str) -> None:
    with pytest.raises(EnvironmentContractError, match=message):
        topology_from_env(env)


def test_placement_from_host_names() -> None:
    hosts = ["b", "a", "b", "a", "c"]
    assert [_placement_from_hostnames(hosts, r) for r in range(5)] == [
        (0, 2, 0, 3),
        (0, 2, 1, 3),
        (1, 2, 0, 3),
        (1, 2, 1, 3),
        (0, 1, 2, 3),
    ]
    assert _placement_from_hostnames(["h"] * 3, 2) == (2, 3, 0, 1)


def test_scale_lr_rules() -> None:
    assert scale_lr(0.1, 4) == pytest.approx(0.4)
    assert scale_lr(0.1, 4, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 4, "none") == pytest.approx(0.1)
    assert scale_lr(0.1, 1) == pytest.approx(0.1)
    with pytest.raises(CollectivesError, match="unknown learning-rate scaling rule"):
        scale_lr(0.1, 4, "cubic")  # type: ignore[arg-type]
    with pytest.raises(CollectivesError):
        scale_lr(0.1, 0)


def test_warmup_ramps_linearly_per_step_then_holds() -> None:
    schedule = WarmupSchedule.for_size(0.1, 8, warmup_epochs=2, steps_per_epoch=5)
    assert schedule.target_lr == pytest.approx(0.8)
    assert schedule.warmup_steps == 10
    lrs = [schedule.lr_at_step(s) for s in range(12)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[5] == pytest.approx(0.45)  # halfway through warm-up
    assert lrs[10:] == pytest.approx([0.8, 0.8])
    assert all(b > a for a, b in itertools.pairwise(lrs[:11]))
    assert schedule.lr_at_epoch(1.0) == pytest.approx(0.45)
    assert WarmupSchedule(0.1, 0.4, warmup_epochs=0).lr_at_step(0) == pytest.approx(0.4)
    with pytest.raises(CollectivesError):
        WarmupSchedule(0.1, 0.4, warmup_epochs=-1)


def test_warmup_scheduler_drives_a_torch_optimizer() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=123.0)
    schedule = WarmupSchedule(0.1, 0.3, warmup_epochs=1, steps_per_epoch=4)
    scheduler = schedule.scheduler(optimizer)
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3, 0.3])


@pytest.mark.parametrize(("num_samples", "size"), [(100, 4), (103, 4), (7, 3), (5, 5), (1000, 7)])
def test_shards_cover_every_sample_exactly_once(num_samples: int, size: int) -> None:
    for epoch in range(3):
        shards = [shard_indices(num_samples, r, size, epoch=epoch, seed=9) for r in range(size)]
        assert sorted(i for s in shards for i in s) == list(range(num_samples))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_shuffle_then_shard_is_shared_and_changes_every_epoch() -> None:
    a = shard_indices(1000, 1, 4, epoch=0, seed=3)
    assert a == shard_indices(1000, 1, 4, epoch=0, seed=3)
    assert a != shard_indices(1000, 1, 4, epoch=1, seed=3)
    assert a != shard_indices(1000, 1, 4, epoch=0, seed=4)
    # The "shard without shuffle" mistake (method A) is opt-in only.
    assert a != list(range(1, 1000, 4))
    assert shard_indices(10, 1, 4, shuffle=False) == [1, 5, 9]


def test_drop_last_gives_equal_shards() -> None:
    shards = [shard_indices(103, r, 4, epoch=2, drop_last=True) for r in range(4)]
    assert {len(s) for s in shards} == {25}
    assert len({i for s in shards for i in s}) == 100


def test_too_few_samples_is_an_error() -> None:
    with pytest.raises(ShardingError, match="cannot shard 3 samples over 4 ranks"):
        shard_indices(3, 0, 4)
    with pytest.raises(ShardingError):
        shard_indices(10, 4, 4)


@pytest.mark.parametrize(
    ("num_samples", "size", "batch"), [(9, 2, 4), (103, 4, 10), (100, 3, 7), (64, 2, 32)]
)
def test_sampler_batches_take_the_same_number_of_steps_everywhere(
    num_samples: int, size: int, batch: int
) -> None:
    samplers = [ShardSampler(num_samples, rank=r, size=size, seed=1) for r in range(size)]
    for epoch in range(2):
        per_rank = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            batches = sampler.batches(batch)
            assert len(batches) == sampler.num_batches(batch)
            assert all(0 < len(b) <= batch for b in batches)
            assert [i for b in batches for i in b] == list(sampler)
            assert len(sampler) == len(list(sampler))
            per_rank.append(batches)
        assert len({len(b) for b in per_rank}) == 1
        assert sorted(i for batches in per_rank for b in batches for i in b) == list(range(num_samples))


def test_sampler_refuses_batches_it_cannot_fill() -> None:
    sampler = ShardSampler(9, rank=1, size=2)  # 4 samples where rank 0 has 5
    with pytest.raises(ShardingError, match="drop_last=True"):
        sampler.batches(1)
    assert len(ShardSampler(9, rank=1, size=2, drop_last=True).batches(1)) == 4


def test_bench_units_and_bus_bandwidth() -> None:
    pytest.importorskip("torch")
    from collectives.bench import bus_bandwidth, parse_size

    assert parse_size("1K") == 1024
    assert parse_size("256M") == 256 * 1024 * 1024
    assert parse_size("4kb") == 4096
    assert parse_size("100") == 100
    assert bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    assert bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert bus_bandwidth(10.0, 1) == 0.0
    assert math.isclose(bus_bandwidth(3.0, 4), 4.5)
