"""collectives.elastic on real ranks driven through the agent's elastic lines (launcher.agent.elastic), the
test standing where the launcher's driver stands: a SIGKILLed rank turns into a rollback on the survivors,
which keep their process and their state and go on in a smaller world (also when the lost peer is silent,
not dead: its wait ends at `peer_lost`, not at the group's timeout); a host update interrupts every rank
at the same commit and a newcomer joins with rank 0's state; a rank told to leave exits cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from launcher.agent.elastic import ElasticLines
from tests.support import REPO, SCRIPTS

SCRIPT = SCRIPTS / "elastic_train.py"
WAIT_S = float(os.environ.get("ELASTIC_TEST_WAIT_S", "120"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def world_env(rank: int, size: int, port: int) -> dict[str, str]:
    """What the driver sends a rank of a one-host world (launcher.core.env computes the real one)."""
    values = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": size}
    values["LOCAL_SIZE"] = size
    values.update({"CROSS_RANK": 0, "CROSS_SIZE": 1, "MASTER_PORT": port, "HOROVOD_RANK": rank})
    values.update({"HOROVOD_SIZE": size, "HOROVOD_LOCAL_RANK": rank, "HOROVOD_LOCAL_SIZE": size})
    values.update({"HOROVOD_CROSS_RANK": 0, "HOROVOD_CROSS_SIZE": 1})
    return {name: str(value) for name, value in values.items()}


class Ranks:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lines = ElasticLines(str(tmp))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, rank_id: int, env: Mapping[str, str], *args: str) -> None:
        full = {
            **os.environ, **env, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1",
            "DISTRUN_START_RANK": str(rank_id), "DISTRUN_ELASTIC_SOCKET": self.lines.open(rank_id),
        }  # fmt: skip
        self.procs[rank_id] = subprocess.Popen([sys.executable, SCRIPT, self.tmp, *args], env=full)

    def until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
            self.lines.poll(0.5)

    def result(self, rank_id: int) -> dict[str, object]:
        assert self.procs[rank_id].wait(WAIT_S) == 0, f"rank {rank_id} failed"
        return dict(json.loads((self.tmp / f"{rank_id}.json").read_text()))

    def started_pid(self, rank_id: int) -> int:
        return next(int(p.stem) for p in self.tmp.glob("*.start") if p.read_text() == str(rank_id))

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.lines.close()


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Ranks]:
    made = Ranks(tmp_path)
    yield made
    made.close()
    assert all(proc.returncode is not None for proc in made.procs.values()), "nothing left running"


def test_survivors_keep_their_process_and_state_when_a_rank_is_killed(ranks: Ranks) -> None:
    port = free_port()
    for rank in range(3):
        ranks.start(rank, world_env(rank, 3, port), "2", "5")
    assert ranks.procs[2].wait(WAIT_S) == -9
    ranks.lines.peer_lost([0, 1])
    ranks.until(lambda: all(ranks.lines.lines[r].ready for r in (0, 1)), "survivor at the reset point")
    new_port = free_port()
    for rank in (0, 1):
        assert ranks.lines.reset(rank, world_env(rank, 2, new_port))
    ranks.until(lambda: all(ranks.lines.lines[r].synced is not None for r in (0, 1)), "first collective")
    results = [ranks.result(rank) for rank in (0, 1)]
    for rank, got in enumerate(results):
        assert got["pid"] == ranks.started_pid(rank), "the survivor kept its process"
        assert (got["rank"], got["size"], got["horovod_size"], got["batch"]) == (rank, 2, "2", 12)
        assert got["sizes"] == [2]
    assert results[0]["weights"] == results[1]["weights"]


def test_a_newcomer_joins_at_the_next_commit_with_rank_0s_state(ranks: Ranks) -> None:
    port = free_port()
    for rank in range(2):
        ranks.start(rank, {**world_env(rank, 2, port), "ELASTIC_WAIT_FOR_HOSTS": "1"}, "-1", "4")
    ranks.until(lambda: all(ranks.lines.opted_in(r) for r in (0, 1)), "ranks opting in")
    ranks.lines.hosts_updated(time.time(), 2)  # added
    ranks.until(lambda: all(ranks.lines.lines[r].ready for r in (0, 1)), "ranks at the reset point")
    new_port = free_port()
    for rank in (0, 1):
        assert ranks.lines.reset(rank, world_env(rank, 3, new_port))
    ranks.start(2, world_env(2, 3, new_port), "-1", "4")
    results = [ranks.result(rank) for rank in range(3)]
    places = [(got["rank"], got["size"], got["batch"]) for got in results]
    assert places == [(0, 3, 12), (1, 3, 12), (2, 3, 12)]
    assert results[0]["sizes"] == results[1]["sizes"] == [3]
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"]
    assert [got["pid"] for got in results[:2]] == [ranks.started_pid(0), ranks.started_pid(1)]


def test_a_rank_told_to_leave_exits_cleanly(ranks: Ranks) -> None:
    port = free_port()
    for rank in range(2):
        ranks.start(rank, {**world_env(rank, 2, port), "ELASTIC_WAIT_FOR_HOSTS": "1"}, "-1", "4")
    ranks.until(lambda: all(ranks.lines.opted_in(r) for r in (0, 1)), "ranks opting in")
    ranks.lines.hosts_updated(time.time(), 1)  # removed
    ranks.until(lambda: all(ranks.lines.lines[r].ready for r in (0, 1)), "ranks at the reset point")
    assert ranks.lines.reset(1, None)
    assert ranks.lines.reset(0, world_env(0, 1, free_port()))
    assert ranks.procs[1].wait(WAIT_S) == 0
    got = ranks.result(0)
    assert (got["size"], got["batch"], got["sizes"]) == (1, 12, [1])


def test_peer_lost_ends_a_wait_on_a_silent_peer_long_before_the_groups_timeout(ranks: Ranks) -> None:
    """A stopped rank stands for a host whose link was cut: its sockets stay open and never answer, so only
    `peer_lost` (the groups' connections shut down) can end the survivors' wait; the group's timeout is
    600 s, beyond the test's wait."""
    port = free_port()
    slow = {"ELASTIC_SLOW_S": "0.2", "ELASTIC_TIMEOUT_S": "600"}
    for rank in range(3):
        ranks.start(rank, {**world_env(rank, 3, port), **slow}, "-1", "0", "30")
    ranks.until(lambda: all(ranks.lines.opted_in(r) for r in range(3)), "ranks opting in")
    os.kill(ranks.procs[2].pid, signal.SIGSTOP)
    ranks.lines.peer_lost([0, 1])
    ranks.until(lambda: all(ranks.lines.lines[r].ready for r in (0, 1)), "survivor at the reset point")
    ranks.procs[2].kill()
    new_port = free_port()
    for rank in (0, 1):
        assert ranks.lines.reset(rank, world_env(rank, 2, new_port))
    results = [ranks.result(rank) for rank in (0, 1)]
    assert [(got["rank"], got["size"], got["batch"], got["sizes"]) for got in results] == [
        (0, 2, 30, [2]),
        (1, 2, 30, [2]),
    ]
    assert [got["pid"] for got in results] == [ranks.started_pid(0), ranks.started_pid(1)]
    assert results[0]["weights"] == results[1]["weights"]
