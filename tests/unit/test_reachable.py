"""An elastic job's first connections (launcher.job.reachable), with a fake `connect` that fails for the hosts
that are "down": who is left out, which plan starts, and the wait for a cooldown below --min-np."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.core.config import LaunchConfig, RestartOptions
from launcher.core.hosts import Host
from launcher.core.plan import build_plan
from launcher.errors import HostError
from launcher.job import reachable
from launcher.job.hostpool import HostPool

FOUR = tuple(Host(f"h{i}", slots=1) for i in range(1, 5))


class Hosts:
    """The fake cluster: `down` hosts fail to connect, as the SSH backend says it (the first one fails)."""

    def __init__(self, *down: str) -> None:
        self.down = set(down)
        self.tried: list[list[str]] = []

    def connect(self, hosts: Sequence[Host], config: LaunchConfig, progress: Any, **kw: Any) -> list[str]:
        names = [h.name for h in hosts]
        self.tried.append(names)
        failing = [name for name in names if name in self.down]
        if failing:
            more = f" (and {len(failing) - 1} more host(s) failed)" if len(failing) > 1 else ""
            raise HostError(f"{failing[0]}: unreachable: no answer within 2s{more}", host=failing[0])
        return names


def _connect(
    hosts: Hosts, monkeypatch: pytest.MonkeyPatch, num_proc: int, **restart: Any
) -> tuple[list[str], int, list[Any], list[tuple[str, str]]]:
    monkeypatch.setattr(reachable, "connect", hosts.connect)
    config = LaunchConfig(
        command=("train.py",), hosts=FOUR, num_proc=num_proc, restart=RestartOptions(**restart)
    )
    said: list[str] = []
    plan, nodes, left_out = reachable.connect_reachable(
        config, build_plan(config.plan_inputs), None, control=None, note=said.extend,
        sleep=lambda seconds: hosts.down.clear(),
    )  # fmt: skip
    assert said == [] or "waiting" in said[0]
    return [h.name for h in plan.nodes], plan.world_size, list(nodes), left_out


def test_a_host_of_the_plan_that_is_down_is_left_out_and_the_rest_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosts = Hosts("h4")
    used, size, nodes, left_out = _connect(hosts, monkeypatch, 4, min_np=2, max_np=4)
    assert (used, size, nodes) == (["h1", "h2", "h3"], 3, ["h1", "h2", "h3"])
    assert left_out == [("h4", "unreachable: no answer within 2s")]


def test_a_spare_takes_the_place_of_a_host_that_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = Hosts("h2")
    used, size, _, left_out = _connect(hosts, monkeypatch, 3, min_np=3, max_np=3)
    assert (used, size) == (["h1", "h3", "h4"], 3)
    assert hosts.tried == [["h1", "h2", "h3", "h4"], ["h1", "h3", "h4"]]  # spares are connected too
    assert [name for name, _ in left_out] == ["h2"]


def test_a_spare_that_is_down_is_only_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    used, size, nodes, left_out = _connect(Hosts("h4"), monkeypatch, 3, min_np=3, max_np=3)
    assert (used, size, nodes) == (["h1", "h2", "h3"], 3, ["h1", "h2", "h3"])
    assert [name for name, _ in left_out] == ["h4"]


def test_too_few_slots_left_is_one_line_naming_every_host_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HostError) as raised:
        _connect(Hosts("h2", "h3", "h4"), monkeypatch, 4, min_np=2, max_np=4)
    assert str(raised.value) == (
        "only 1 slot reachable (h1), fewer than --min-np 2; h2: unreachable: no answer within 2s; "
        "h3: unreachable: no answer within 2s; h4: unreachable: no answer within 2s"
    )


def test_with_a_cooldown_the_start_waits_for_a_host_to_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = Hosts("h2", "h3", "h4")
    used, size, _, left_out = _connect(hosts, monkeypatch, 4, min_np=4, max_np=4, cooldown_range=(1.0, 1.0))
    assert (used, size, left_out) == (["h1", "h2", "h3", "h4"], 4, [])


def test_a_fixed_size_job_refuses_to_start_with_a_host_down(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HostError, match="h4: unreachable"):
        _connect(Hosts("h4"), monkeypatch, 4)


def test_a_spare_that_fails_its_probe_is_left_out_and_the_probe_made_again() -> None:
    config = LaunchConfig(command=("train.py",), hosts=FOUR, num_proc=2, restart=RestartOptions(min_np=1))
    said: list[str] = []
    pool = HostPool(config, said.extend)
    dropped: list[str] = []
    spares = [
        SimpleNamespace(name=n, node=SimpleNamespace(drop=lambda n=n: dropped.append(n)))
        for n in ("h3", "h4")
    ]
    probes: list[list[str]] = []

    def probe(hosts: Sequence[Any]) -> None:
        probes.append([h.name for h in hosts])
        if any(h.name == "h3" for h in hosts):
            raise HostError("host h3: no answer from the distrun agent within 30s", host="h3")

    kept = pool.probed(spares, probe)
    assert [s.name for s in kept] == ["h4"] and dropped == ["h3"]
    assert probes == [["h3", "h4"], ["h4"]]
    unfit = "unfit as a spare (no answer from the distrun agent within 30s)"
    assert said == [f"leaving out host h3 for the rest of the job: {unfit}"]
    assert (
        pool.probed([], probe) == [] and probes[-1] == []
    )  # no spares: the attempt's hosts are probed still

    def broken(hosts: Sequence[Any]) -> None:
        raise HostError("host h1: the distrun agent exited before answering", host="h1")

    with pytest.raises(HostError, match="host h1"):  # a host of the plan is no spare: the error stands
        pool.probed(kept, broken)
