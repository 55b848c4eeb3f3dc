"""Ranks to GPUs and cores (launcher.core.devices): visible devices as CUDA reads them, GPUs and cores per
rank."""

from __future__ import annotations

import pytest

from launcher.core.devices import (
    DeviceError,
    Gpu,
    HostDevices,
    Placement,
    RankDevices,
    describe,
    format_cpulist,
    looks_like_gpu_job,
    parse_cpulist,
    place_ranks,
    shared_gpu_warnings,
    split_evenly,
    visible_gpus,
)
from launcher.core.hosts import Host, parse_host_list
from launcher.core.plan import make_plan
from launcher.errors import EXIT_HOST, UsageError

UUIDS = ("GPU-8f2c0a11-aaaa", "GPU-19d04b22-bbbb", "GPU-77e1c933-cccc", "GPU-0b5ad044-dddd")
# Four GPUs, two per NUMA node, on a 16-core host: node 0 has cores 0-7, node 1 has 8-15.
FOUR = tuple(Gpu(i, UUIDS[i], i // 2) for i in range(4))
NUMA = ((0, tuple(range(8))), (1, tuple(range(8, 16))))


def host(visible: str | None = None, cores: range = range(16), gpus: tuple[Gpu, ...] = FOUR) -> HostDevices:
    return HostDevices(gpus=gpus, visible_devices=visible, cores=tuple(cores), numa_cores=NUMA)


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (None, ["0", "1", "2", "3"]),
        ("", []),
        ("2,3", ["2", "3"]),
        (" 3 , 1 ", ["3", "1"]),
        ("1gpu,2x", ["1", "2"]),  # read like strtoul, as CUDA does
        ("1,-1,2", ["1"]),  # stops at the first invalid entry
        ("0,7,1", ["0"]),  # ... or the first that is out of range
        ("1,1", []),  # a repeated entry hides every device
        ("-1", []),
        ("GPU-19d0,GPU-0b5a", ["GPU-19d0", "GPU-0b5a"]),  # unique UUID prefixes
        ("GPU-19d0,2", ["GPU-19d0"]),  # another kind of entry ends the list
        ("GPU-ffff,GPU-19d0", []),  # a UUID of no GPU here ends it
        ("MIG-4f1e,MIG-5a2b", ["MIG-4f1e", "MIG-5a2b"]),
    ],
)
def test_visible_devices_as_cuda_reads_them(value: str | None, ids: list[str]) -> None:
    assert [g.id for g in visible_gpus(value, FOUR)] == ids


def test_visible_devices_keep_their_numa_node() -> None:
    assert [g.numa_node for g in visible_gpus("3,0", FOUR)] == [1, 0]
    assert [g.numa_node for g in visible_gpus("GPU-77e1", FOUR)] == [1]
    assert [g.numa_node for g in visible_gpus("MIG-4f1e", FOUR)] == [None]
    # Without UUIDs from the driver a UUID cannot be checked, only passed on.
    assert [g.id for g in visible_gpus("GPU-abc", (Gpu(0),))] == ["GPU-abc"]


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("", ()), ("2,0-1", (0, 1, 2))],
)
def test_cpulists(text: str, cores: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cores
    assert parse_cpulist(format_cpulist(cores)) == cores


def test_host_devices_from_the_agents_raw_report() -> None:
    report = {
        "gpus": [
            {"index": 0, "uuid": UUIDS[0], "numa_node": "1"},
            {"index": 1, "uuid": None, "numa_node": -1},
        ],
        "visible_devices": "1",
        "cores": [3, 1, 2],
        "numa_cpulists": {"1": "0-3", "0": "4-7"},
    }
    assert HostDevices.from_json(report) == HostDevices(
        gpus=(Gpu(0, UUIDS[0], 1), Gpu(1, None, None)),
        visible_devices="1",
        cores=(1, 2, 3),
        numa_cores=((0, (4, 5, 6, 7)), (1, (0, 1, 2, 3))),
    )
    assert HostDevices.from_json({}) == HostDevices()


def test_split_evenly_gives_the_extra_cores_to_the_first_ranks() -> None:
    assert split_evenly([0, 1, 2, 3, 4, 5, 6], 3) == [(0, 1, 2), (3, 4), (5, 6)]
    assert split_evenly([4, 9], 2) == [(4,), (9,)]


def place(
    hosts: str, visible: list[HostDevices], placement: Placement
) -> tuple[tuple[RankDevices, ...], tuple[str, ...]]:
    return place_ranks(make_plan(parse_host_list(hosts), None), visible, placement)


@pytest.mark.parametrize(
    ("visible", "per_rank", "expected"),
    [
        (None, 1, [("0",), ("1",)]),
        (None, 2, [("0", "1"), ("2", "3")]),
        ("2,3", 1, [("2",), ("3",)]),
        ("3,2,1,0", 2, [("3", "2"), ("1", "0")]),
        ("GPU-77e1,GPU-8f2c", 1, [("GPU-77e1",), ("GPU-8f2c",)]),
    ],
)
def test_gpus_per_rank_hand_out_the_hosts_visible_devices_in_order(
    visible: str | None, per_rank: int, expected: list[tuple[str, ...]]
) -> None:
    ranks, notes = place("a:2", [host(visible)], Placement(gpus_per_rank=per_rank))
    assert [r.gpus for r in ranks] == expected
    assert [r.cores for r in ranks] == [None, None] and notes == ()


def test_each_host_numbers_its_own_gpus() -> None:
    ranks, _ = place("a:2,b:2", [host(), host("1,2")], Placement(gpus_per_rank=1))
    assert [r.gpus for r in ranks] == [("0",), ("1",), ("1",), ("2",)]


@pytest.mark.parametrize(
    ("visible", "per_rank", "message"),
    [
        (None, 3, r"host a: ranks 0-1 need 3 GPUs each \(6\), but it shows 4 GPUs \(0,1,2,3\)$"),
        (
            "2",
            1,
            r"^host a: "
            r"ranks 0-1 need 1 GPU each \(2\), but it shows 1 GPU \(2\) with CUDA_VISIBLE_DEVICES='2'$",
        ),
        ("", 1, r"but it shows 0 GPUs \(none\) with CUDA_VISIBLE_DEVICES=''$"),
    ],
)
def test_too_few_gpus_name_host_ranks_and_gpus(visible: str | None, per_rank: int, message: str) -> None:
    with pytest.raises(DeviceError, match=message) as caught:
        place("a:2", [host(visible)], Placement(gpus_per_rank=per_rank))
    assert (caught.value.exit_code, caught.value.host) == (EXIT_HOST, "a")


def test_a_host_without_gpus_is_refused_by_name() -> None:
    with pytest.raises(DeviceError, match=r"^host b: rank 2 needs 1 GPU, but it shows 0 GPUs"):
        place("a:2,b:1", [host(), host(gpus=())], Placement(gpus_per_rank=1))


@pytest.mark.parametrize(
    ("cores", "ranks", "expected"),
    [
        (range(16), 4, [range(0, 4), range(4, 8), range(8, 12), range(12, 16)]),
        (range(4, 9), 2, [range(4, 7), range(7, 9)]),
        (range(2), 2, [range(0, 1), range(1, 2)]),
    ],
)
def test_bind_cores_splits_the_allowed_cores_evenly(cores: range, ranks: int, expected: list[range]) -> None:
    placed, _ = place(f"a:{ranks}", [host(cores=cores)], Placement(bind_cores=True))
    assert [r.cores for r in placed] == [tuple(r) for r in expected]
    assert all(r.gpus is None for r in placed)


def test_more_ranks_than_allowed_cores_is_refused() -> None:
    with pytest.raises(
        DeviceError,
        match=r"^host a: ranks 0-2 need 1 core each \(3\), but only 2 cores are allowed there \(4-5\)$",
    ):
        place("a:3", [host(cores=range(4, 6))], Placement(bind_cores=True))


def test_numa_binding_gives_each_rank_cores_of_its_gpus_node() -> None:
    placed, notes = place(
        "a:4", [host("0,2,1,3", cores=range(1, 16))], Placement(gpus_per_rank=1, numa_binding=True)
    )
    assert notes == ()
    # GPUs 0 and 1 sit on node 0 (cores 0-7, of which 1-7 are allowed), 2 and 3 on node 1.
    assert [(r.gpus, r.cores) for r in placed] == [
        (("0",), (1, 2, 3, 4)),
        (("2",), (8, 9, 10, 11)),
        (("1",), (5, 6, 7)),
        (("3",), (12, 13, 14, 15)),
    ]


def test_numa_binding_with_an_unknown_node_falls_back_to_an_even_split_with_a_note() -> None:
    gpus = (Gpu(0, None, 0), Gpu(1, None, None))
    placed, notes = place("a:2", [host(gpus=gpus)], Placement(gpus_per_rank=1, numa_binding=True))
    assert [r.cores for r in placed] == [tuple(range(8)), tuple(range(8, 16))]
    assert notes == ("host a: a GPU's NUMA node is unknown there, so its cores are split evenly instead",)


def test_numa_binding_when_a_nodes_allowed_cores_are_fewer_than_its_ranks_falls_back() -> None:
    placed, notes = place("a:2", [host(cores=[0, 8, 9])], Placement(gpus_per_rank=1, numa_binding=True))
    assert [r.cores for r in placed] == [(0, 8), (9,)]
    assert len(notes) == 1


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ({"gpus_per_rank": 0}, "--gpus-per-rank must be at least 1, got 0"),
        ({"numa_binding": True}, "give --gpus-per-rank"),
    ],
)
def test_bad_placement_options(asked: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Placement(**asked)  # type: ignore[arg-type]


def test_describe_one_line_per_host() -> None:
    plan = make_plan((Host("a", 2), Host("b", 1)), None)
    ranks = (
        RankDevices(0, ("0", "1"), (0, 1, 2, 3)),
        RankDevices(1, ("2", "3"), (4, 5, 6, 7)),
        RankDevices(2, ("GPU-77e1",), None),
    )
    assert describe(plan, ranks) == [
        "host a: rank 0: GPUs 0,1 cores 0-3; rank 1: GPUs 2,3 cores 4-7",
        "host b: rank 2: GPU GPU-77e1",
    ]


@pytest.mark.parametrize(
    ("command", "gpu_job"),
    [
        (["train.py"], True),
        (["/usr/bin/python3.11", "-m", "pkg.train"], True),
        (["torchrun", "x.py"], True),
        (["hostname"], False),
        (["bash", "-c", "python x.py"], False),
    ],
)
def test_what_looks_like_a_gpu_job(command: list[str], gpu_job: bool) -> None:
    assert looks_like_gpu_job(command) is gpu_job


def test_shared_gpus_warn_per_host_only_for_gpu_jobs() -> None:
    plan = make_plan(parse_host_list("a:2,b:4,c:2"), None)
    assert shared_gpu_warnings(plan, [2, 1, 0], ["train.py"]) == [
        "host b: 4 ranks share 1 GPU, so they cannot each have their own (collectives falls back to gloo "
        "there); for a GPU job start at most 1 there, or use --gpus-per-rank on hosts with enough"
    ]
    assert shared_gpu_warnings(plan, [2, 1, 0], ["hostname"]) == []
