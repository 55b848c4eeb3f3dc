"""The verdict reads each rank's main thread, and only a collective called from the user's code counts
(issue 38, item 3): `hvd.elastic.run`'s wrapper and the engine's thread are no collective of the rank's."""

from __future__ import annotations

import itertools

import pytest

from launcher.diagnose.stacks import Frame, RankStacks, StackDump, ThreadStack, group_stacks, verdict

REPO = "/work/distrun"
SITE = "/venv/lib/python3.11/site-packages"
WRAPPER = (
    Frame("<module>", "/job/train.py", 40),
    Frame("run.<locals>.wrapper", f"{REPO}/collectives/elastic/run.py", 61),
    Frame("train", "/job/train.py", 31),
)
SLEEPING = (*WRAPPER, Frame("time_sleep", "libpython3.11.so", native=True))
ALLREDUCE = (
    *WRAPPER,
    Frame("allreduce", f"{REPO}/collectives/ops/_allreduce.py", 70),
    Frame("HandleBase.wait", f"{REPO}/collectives/ops/_handle.py", 120),
    Frame("wait", "/usr/lib/python3.11/threading.py", 320),
)
# hvd.elastic's reset held in the user's reset callback: the library called the user back.
IN_CALLBACK = (
    *WRAPPER[:2],
    Frame("_reset", f"{REPO}/collectives/elastic/run.py", 90),
    Frame("held", "/job/train.py", 20),
    Frame("pause", "signal", native=True),
)
ENGINE_WAITS = (
    Frame("_bootstrap", "/usr/lib/python3.11/threading.py", 995),
    Frame("run", "/usr/lib/python3.11/threading.py", 975),
    Frame("Engine._run", f"{REPO}/collectives/engine.py", 292),
)
ENGINE_EXCHANGES = (
    *ENGINE_WAITS[:2],
    Frame("Engine._run", f"{REPO}/collectives/engine.py", 300),
    Frame("_gather", f"{REPO}/collectives/engine_rounds.py", 137),
    Frame("c10d::Work::wait", "libtorch_cpu.so", native=True),
)
CHANNEL = (*ENGINE_WAITS[:2], Frame("Channel._read", f"{REPO}/collectives/elastic/channel.py", 60))
TORCH_BARRIER = (
    Frame("<module>", "/job/train.py", 12),
    Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
    Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 5356),
)


def elastic_rank(rank: int, main: tuple[Frame, ...], engine: tuple[Frame, ...]) -> RankStacks:
    threads = (
        ThreadStack("collectives-engine-0", engine),
        ThreadStack("collectives-elastic", CHANNEL),
        ThreadStack("MainThread", main, main=True),
    )
    return RankStacks(rank, "h1", 100 + rank, "py-spy", threads)


def test_ranks_sleeping_inside_the_elastic_wrapper_are_not_in_a_collective() -> None:
    # The engine threads differ (one is in a round): two groups, one place, whatever the order.
    stacks = [elastic_rank(0, SLEEPING, ENGINE_WAITS), elastic_rank(1, SLEEPING, ENGINE_EXCHANGES)]
    assert len(group_stacks(stacks)) == 2
    assert verdict(group_stacks(stacks), 2) == (
        "both ranks are at the same place, not in a collective: in train, train.py:31"
    )


def test_a_rank_in_the_users_reset_callback_is_named_by_it() -> None:
    stacks = [elastic_rank(0, IN_CALLBACK, ENGINE_WAITS)]
    assert verdict(group_stacks(stacks), 1) == "rank 0 is not in a collective: in held, train.py:20"


def test_a_collective_called_from_inside_the_wrapper_counts() -> None:
    stacks = [elastic_rank(0, ALLREDUCE, ENGINE_EXCHANGES), elastic_rank(1, SLEEPING, ENGINE_WAITS)]
    assert verdict(group_stacks(stacks), 2) == (
        "1 rank waits in a collective (HandleBase.wait); rank 1 is elsewhere: in train, train.py:31"
    )


def test_torch_distributeds_logging_wrapper_is_still_inside_the_collective() -> None:
    stacks = [elastic_rank(0, TORCH_BARRIER, ENGINE_WAITS)]
    assert verdict(group_stacks(stacks), 1) == "rank 0 is in a collective (barrier) at <module>, train.py:12"


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_the_same_state_gives_the_same_verdict_and_lines_in_any_order(order: tuple[int, ...]) -> None:
    engines = [ENGINE_WAITS, ENGINE_EXCHANGES, ENGINE_WAITS, ENGINE_EXCHANGES]
    stacks = [elastic_rank(r, SLEEPING, engines[r]) for r in range(4)]
    shuffled = []
    for r in order:
        threads = stacks[r].threads
        # The threads of a rank come in any order too (py-spy's, faulthandler's newest first).
        turned = threads[r % 3 :] + threads[: r % 3]
        shuffled.append(RankStacks(r, "h1", 100 + r, "py-spy", turned))
    expected = StackDump.of("request", 0.0, 4, stacks)
    dump = StackDump.of("request", 0.0, 4, shuffled)
    assert dump.verdict == "all 4 ranks are at the same place, not in a collective: in train, train.py:31"
    assert dump.lines() == expected.lines()
