"""The supervisor with a JobWatch, driven in-process with fake links: the timeout's stacks and a slow host."""

from __future__ import annotations

from launcher.agent.protocol import STACKS, STOP
from launcher.core.result import TimedOut
from launcher.diagnose.watch import AGENT_SLACK
from tests.unit.watch_support import FRAMES, WAIT, reply, sent, watched


def test_the_timeout_waits_for_the_stacks_then_stops_every_host() -> None:
    hosts, sup, watch = watched(timeout=5.0)
    sup.on_tick(5.0)
    assert [f.kind for f in sent(hosts[0])] == [STACKS], "the stacks are asked for before anything stops"
    assert sup.cause is None and sup.until_deadline(5.0) is None
    reply(sup, hosts[0], [{"rank": 0, "threads": [{"main": True, "frames": FRAMES}]}], 5.5)
    assert sup.cause is None, "one host of two answered: still gathering"
    reply(sup, hosts[1], [{"rank": 2, "threads": [{"main": True, "frames": FRAMES}]}], 6.0)
    assert sup.outcome() == TimedOut(5.0, (0, 1, 2))
    assert [f.kind for f in sent(hosts[1])] == [STACKS, STOP]
    dump = watch.dumps[0]
    assert dump.reason == "timeout"
    # Rank 1 is on an answering host but was not in its answer: it no longer runs.
    assert [(g.ranks, g.error) for g in dump.groups] == [((0, 2), ""), ((1,), "it has exited")]


def test_a_host_that_does_not_answer_holds_the_others_only_until_the_bounded_wait() -> None:
    hosts, sup, watch = watched(timeout=5.0)
    sup.on_tick(5.0)
    reply(sup, hosts[0], [{"rank": r, "threads": [{"main": True, "frames": FRAMES}]} for r in (0, 1)], 5.5)
    deadline = 5.0 + WAIT + AGENT_SLACK
    assert watch.next_deadline() == deadline
    sup.on_tick(deadline - 0.1)
    assert sup.cause is None
    sup.on_tick(deadline)
    assert isinstance(sup.outcome(), TimedOut)
    groups = [(g.ranks, g.hosts, g.error) for g in watch.dumps[0].groups]
    assert groups == [
        ((0, 1), ("h1",), ""),
        ((2,), ("h2",), f"its host's agent did not answer within {WAIT + AGENT_SLACK:g}s"),
    ]


def test_after_a_reset_in_place_the_ranks_that_left_are_neither_named_nor_counted() -> None:
    hosts, sup, watch = watched(timeout=5.0)
    watch.world = lambda: ([(0, "h1"), (2, "h2")], {1: "h1"})  # rank 1 left the world in a reset
    sup.on_tick(5.0)
    reply(sup, hosts[0], [{"rank": 0, "threads": [{"main": True, "frames": FRAMES}]}], 5.5)
    reply(sup, hosts[1], [{"rank": 2, "threads": [{"main": True, "frames": FRAMES}]}], 6.0)
    dump = watch.dumps[0]
    assert [(g.ranks, g.error) for g in dump.groups] == [((0, 2), "")]
    assert dump.world_size == 2
    assert (
        dump.verdict
        == "both ranks are at the same place, not in a collective: in stuck_in_loader, train.py:41"
    )
