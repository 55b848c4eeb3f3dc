"""The host watch's planned reset with fake agents (launcher.job.host_watch, launcher.job.elastic): what each
agent is sent when the discovery script's hosts change, and when nothing is sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from launcher.agent.protocol import LEAVE, NOTICE, RESET, LeaveRequest, Notice, ResetRequest, decode_frame
from launcher.core.hosts import Host
from launcher.job.elastic import Resetter
from launcher.job.host_watch import HostWatch
from launcher.runtime.node import HostAttempt
from tests.fakes import FakeLink, fake_hosts


def _resetter(hosts: list[HostAttempt], lines: list[str], reset_limit: int | None = None) -> Resetter:
    resetter = Resetter(
        hosts, min_np=1, reset_limit=reset_limit, run_id="r", max_restarts=0,
        master_addr=lambda name: f"addr-{name}", note=lines.extend, max_np=4,
    )  # fmt: skip
    for rank_id in resetter.host_of:
        resetter.opted_in(rank_id)
    return resetter


def _sent(host: HostAttempt, kind: int) -> list[Any]:
    link = cast(FakeLink, host.node.link)
    return [decode_frame(frame) for frame in link.sent if frame.kind == kind]


class _Sup:
    """What the watch asks of the Supervisor."""

    def __init__(self) -> None:
        self.ended = False

    def end_job(self, now: float) -> None:
        self.ended = True


def _watch(resetter: Resetter, known: list[Host], latest: list[Host]) -> tuple[HostWatch, _Sup]:
    watch = HostWatch(Path("/bin/true"), known, resetter, lambda new: [], max_np=4, called_before=True)
    sup = _Sup()
    watch.attach(cast(Any, sup))
    watch.latest = tuple(latest)
    return watch, sup


def test_a_removed_hosts_ranks_get_leave_and_the_others_their_new_places() -> None:
    hosts = fake_hosts({"a": 2, "b": 2})
    lines: list[str] = []
    resetter = _resetter(hosts, lines)
    watch, _ = _watch(resetter, [Host("a", 2), Host("b", 2)], [Host("b", 2)])
    watch.tick(0.0)
    notices = [n for host in hosts for n in _sent(host, NOTICE)]
    assert notices == [
        Notice([0, 1], "hosts_updated", notices[0].timestamp, 1),
        Notice([2, 3], "hosts_updated", notices[0].timestamp, 1),
    ], "every rank hears it, those leaving too"
    assert not _sent(hosts[1], RESET), "nothing moves before the staying ranks are at their commit"
    resetter.ready(2, 4000, 1.0)
    resetter.ready(3, 4001, 1.0)
    [reset] = _sent(hosts[1], RESET)
    assert isinstance(reset, ResetRequest)
    assert {rank_id: (env["RANK"], env["WORLD_SIZE"]) for rank_id, env in reset.envs.items()} == {
        "2": ("0", "2"),
        "3": ("1", "2"),
    }
    assert reset.envs["2"]["MASTER_ADDR"] == "addr-b" and reset.envs["2"]["MASTER_PORT"] == "4000"
    assert _sent(hosts[0], LEAVE) == [LeaveRequest([0, 1])]
    resetter.synced(2, 0.5, 2.0)
    resetter.synced(3, 0.5, 2.0)
    assert lines == [
        "reset 1: hosts removed: a (--host-discovery-script); left: rank 0, rank 1 (on a); joined: none; "
        "world size 2; training again 0.50s after the commit"
    ]
    assert resetter.absorb([0], "rank 0 exited", 3.0), "a leaving rank's end is no loss"


def test_nothing_is_sent_until_every_rank_opted_in_nor_for_slots_beyond_max_np() -> None:
    hosts = fake_hosts({"a": 2, "b": 2})
    resetter = _resetter(hosts, [])
    resetter.opted.discard(3)
    watch, _ = _watch(resetter, [Host("a", 2), Host("b", 2)], [Host("a", 2)])
    watch.tick(0.0)
    assert not any(_sent(host, NOTICE) for host in hosts)
    resetter.opted_in(3)
    full, _ = _watch(resetter, [Host("a", 2), Host("b", 2)], [Host("a", 2), Host("b", 2), Host("c", 4)])
    full.tick(0.0)
    assert not any(_sent(host, NOTICE) for host in hosts), "--max-np 4 is reached: c is a spare"


def test_a_change_past_the_reset_limit_stops_the_job_naming_it() -> None:
    hosts = fake_hosts({"a": 2, "b": 2})
    resetter = _resetter(hosts, [], reset_limit=0)
    watch, sup = _watch(resetter, [Host("a", 2), Host("b", 2)], [Host("b", 2)])
    watch.tick(0.0)
    assert sup.ended and watch.fatal is not None
    assert str(watch.fatal) == (
        "the job ends: --reset-limit 0 reached (0 resets done); the next: hosts removed: a "
        "(--host-discovery-script)"
    )
    assert not any(_sent(host, NOTICE) for host in hosts)


def test_an_added_host_that_is_refused_costs_no_reset_and_no_rank() -> None:
    """The join (connect, probe, software check) comes before any rank hears of the change: a refused host
    begins no reset (no callbacks, nothing against --reset-limit), and no rank id is taken for it."""
    hosts = fake_hosts({"a": 1, "b": 1})
    resetter = _resetter(hosts, [], reset_limit=1)
    asked: list[list[str]] = []

    def refuse(new: Any) -> list[HostAttempt]:
        asked.append([h.name for h in new])
        return []

    watch = HostWatch(
        Path("/bin/true"), [Host("a", 1), Host("b", 1)], resetter, refuse, max_np=4, called_before=True
    )
    sup = _Sup()
    watch.attach(cast(Any, sup))
    watch.latest = (Host("a", 1), Host("b", 1), Host("c", 1))
    watch.tick(0.0)
    watch.tick(1.0)
    assert asked == [["c"]], "asked once; left out while the script lists it"
    assert not any(_sent(host, NOTICE) for host in hosts) and not resetter.resetting
    assert sorted(resetter.host_of) == [0, 1]
    assert resetter.absorb([1], "rank 1 (host b) exited with code 1", 2.0), (
        "the one reset allowed is still there"
    )


def test_a_host_left_out_stays_out_of_the_scripts_answers_until_its_time() -> None:
    hosts = fake_hosts({"a": 1, "b": 1})
    resetter = _resetter(hosts, [])
    out_until = {"b": 10.0}
    now = [0.0]
    exclusions = {"b": 1}
    watch = HostWatch(
        Path("/bin/true"), [Host("a", 1), Host("b", 1)], resetter, lambda new: [], max_np=4,
        called_before=True, usable=lambda h: now[0] >= out_until.get(h, 0.0),
        exclusions=lambda h: exclusions.get(h, 0),
    )  # fmt: skip
    watch.attach(cast(Any, _Sup()))
    exclusions["b"] = 2  # left out again since the world formed
    watch.latest = (Host("a", 1), Host("b", 1))
    watch.tick(0.0)
    assert not any(_sent(host, NOTICE) for host in hosts), "b is out: not an addition, not a removal"
    assert [h.name for h in watch.known] == ["a"]


def test_a_host_the_script_dropped_takes_no_newcomer_when_a_later_loss_frees_room() -> None:
    hosts = fake_hosts({"a": 2, "b": 1, "c": 1})
    lines: list[str] = []
    spawned: list[str] = []
    resetter = Resetter(
        hosts, min_np=1, reset_limit=None, run_id="r", max_restarts=0, master_addr="addr-{}".format,
        note=lines.extend, max_np=4, spawn=lambda world, newcomers, envs: spawned.extend(
            member.host.name for member in newcomers
        ),
    )  # fmt: skip
    for rank_id in resetter.host_of:
        resetter.opted_in(rank_id)
    watch, _ = _watch(resetter, [Host("a", 2), Host("b", 1), Host("c", 1)], [Host("a", 2), Host("b", 1)])
    watch.tick(0.0)
    for rank_id in (0, 1, 2):
        resetter.ready(rank_id, 4000 + rank_id, 1.0)
    for rank_id in (0, 1, 2):
        resetter.synced(rank_id, 0.5, 2.0)
    assert len(lines) == 1 and "hosts removed: c" in lines[0]
    assert resetter.absorb([2], "rank 2 (host b) exited with code 1", 3.0)
    resetter.ready(0, 4010, 4.0)
    resetter.ready(1, 4011, 4.0)
    assert spawned == [], "c was dropped by the script: its free slot takes no newcomer"
    last = _sent(hosts[0], RESET)[-1]
    assert isinstance(last, ResetRequest) and last.envs["0"]["WORLD_SIZE"] == "2"
