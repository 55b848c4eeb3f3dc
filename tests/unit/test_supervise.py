"""The supervisor's decisions, driven in-process with fake links: no processes, no sockets."""

from __future__ import annotations

import os
import signal

import pytest

from launcher.agent.protocol import (
    DONE,
    EXIT,
    HEADER,
    HELLO_HEADER,
    KILL,
    OUT,
    STOP,
    VERSION,
    Frame,
    RankExited,
    StopRequest,
    encode,
    encode_message,
)
from launcher.core.result import HostLost, RankFailed, Signalled, Succeeded, TimedOut
from launcher.errors import HostError
from launcher.job.supervise import TEARDOWN_SLACK, Supervisor, supervise
from launcher.runtime.loop import Deadline
from launcher.runtime.node import HostAttempt, close_all
from launcher.signals import signal_pipe
from tests.fakes import DONE_FRAME, FakeLink, exited, fake_hosts, hello, memory_relay


def _supervisor(nodes: list[HostAttempt], *, timeout: float | None = None, now: float = 0.0) -> Supervisor:
    relay, _, _ = memory_relay({s.rank: n.name for n in nodes for s in n.slots})
    return Supervisor(nodes, relay, deadline=Deadline(timeout, now), grace=1.0, dead_after=10.0)


def _link(node: HostAttempt) -> FakeLink:
    assert isinstance(node.link, FakeLink)
    return node.link


def _exit(sup: Supervisor, node: HostAttempt, rank: int, code: int, now: float) -> None:
    sup.on_frame(node, Frame(EXIT, 0, rank, encode_message(EXIT, RankExited(code))[HEADER.size :]), now)


def _done(sup: Supervisor, node: HostAttempt, now: float = 0.0) -> None:
    sup.on_frame(node, Frame(DONE, 0, -1, b""), now)


def test_every_rank_succeeding_ends_the_attempt_with_success() -> None:
    nodes = fake_hosts({"a": 2, "b": 1})
    sup = _supervisor(nodes)
    for node in nodes:
        for slot in node.slots:
            _exit(sup, node, slot.rank, 0, 0.0)
        _done(sup, node)
    assert sup.done
    assert sup.outcome() == Succeeded()
    assert sup.outcome().exit_code == 0
    assert all(STOP not in _link(n).kinds() for n in nodes)


def test_first_failure_stops_every_unfinished_host_and_names_the_running_ranks() -> None:
    nodes = fake_hosts({"a": 2, "b": 2})
    sup = _supervisor(nodes)
    _exit(sup, nodes[0], 0, 0, 0.0)
    _exit(sup, nodes[1], 3, 7, 0.0)
    _exit(sup, nodes[1], 2, -15, 0.1)  # stopped by us: not the cause
    outcome = sup.outcome()
    assert isinstance(outcome, RankFailed)
    assert (outcome.failure.rank, outcome.failure.host, outcome.exit_code) == (3, "b", 7)
    assert outcome.stopped == (1, 2)
    assert outcome.retryable
    assert [_link(n).kinds().count(STOP) for n in nodes] == [1, 1]


def test_death_by_signal_is_128_plus_the_signal() -> None:
    nodes = fake_hosts({"a": 1})
    sup = _supervisor(nodes)
    _exit(sup, nodes[0], 0, -9, 0.0)
    assert sup.outcome().exit_code == 137


def test_ctrl_c_stops_once_and_a_second_one_kills() -> None:
    nodes = fake_hosts({"a": 1, "b": 1})
    sup = _supervisor(nodes)
    sup.on_signal(signal.SIGINT, 0.0)
    sup.on_signal(signal.SIGINT, 0.5)
    sup.on_signal(signal.SIGINT, 0.6)
    outcome = sup.outcome()
    assert isinstance(outcome, Signalled) and not outcome.retryable
    assert (outcome.signal_name, outcome.exit_code, outcome.stopped) == ("SIGINT", 130, (0, 1))
    assert [_link(n).kinds() for n in nodes] == [[STOP, KILL], [STOP, KILL]]


def test_sigterm_exits_143_and_is_never_retried() -> None:
    sup = _supervisor(fake_hosts({"a": 1}))
    sup.on_signal(signal.SIGTERM, 0.0)
    assert (sup.outcome().exit_code, sup.outcome().retryable) == (143, False)


def test_timeout_fires_at_its_deadline_only() -> None:
    nodes = fake_hosts({"a": 1})
    sup = _supervisor(nodes, timeout=5.0, now=100.0)
    assert sup.until_deadline(101.0) == 4.0
    sup.on_tick(104.9)
    assert sup.cause is None
    sup.on_tick(105.0)
    assert sup.outcome() == TimedOut(5.0, (0,))
    assert sup.outcome().exit_code == 124
    assert sup.until_deadline(106.0) is None


def test_a_silent_remote_host_is_lost_and_the_others_stopped() -> None:
    nodes = fake_hosts({"a": 1, "b": 1}, heartbeat=True)
    sup = _supervisor(nodes)
    nodes[0].node.last_heard = nodes[1].node.last_heard = 0.0
    nodes[0].node.last_heard = 9.0
    sup.on_tick(11.0)
    outcome = sup.outcome()
    assert isinstance(outcome, HostLost) and outcome.retryable
    assert outcome.host == "b" and "no word from it" in outcome.detail
    assert _link(nodes[1]).aborted and nodes[1].finished
    assert _link(nodes[0]).kinds() == [STOP]


def test_local_hosts_are_never_judged_by_silence() -> None:
    nodes = fake_hosts({"a": 1})
    nodes[0].node.last_heard = 0.0
    sup = _supervisor(nodes)
    sup.on_tick(1000.0)
    assert sup.cause is None


def test_a_closed_link_loses_the_host_with_what_the_agent_said() -> None:
    nodes = fake_hosts({"a": 1, "b": 1})
    sup = _supervisor(nodes)
    sup.on_closed(nodes[0], 0.0)
    outcome = sup.outcome()
    assert outcome == HostLost("a", "agent said goodbye", (0, 1))
    assert outcome.exit_code == 3


def test_agents_that_do_not_finish_stopping_are_dropped_after_grace_and_slack() -> None:
    nodes = fake_hosts({"a": 1, "b": 1})
    sup = _supervisor(nodes)
    sup.on_signal(signal.SIGTERM, 0.0)
    _done(sup, nodes[0])
    sup.on_tick(1.0 + TEARDOWN_SLACK - 0.1)
    assert not sup.done
    sup.on_tick(1.0 + TEARDOWN_SLACK + 0.1)
    assert sup.done and _link(nodes[1]).aborted and not _link(nodes[0]).aborted


def test_output_frames_reach_the_relay_prefixed() -> None:
    nodes = fake_hosts({"a": 1})
    relay, out, _ = memory_relay({0: "a"})
    sup = Supervisor(nodes, relay, grace=1.0, dead_after=10.0)
    sup.on_frame(nodes[0], Frame(OUT, 0, 0, b"hello\n"), 0.0)
    relay.flush()
    assert out.getvalue() == b"[0] hello\n"


def test_the_loop_feeds_frames_and_signals_to_the_supervisor() -> None:
    nodes = fake_hosts({"a": 1, "b": 1})
    for node in nodes:
        _link(node).push(hello())
    _link(nodes[0]).push(exited(0, 0) + DONE_FRAME)
    sup = _supervisor(nodes)
    with signal_pipe() as wake_fd:
        os.kill(os.getpid(), signal.SIGTERM)
        # b's agent answers the STOP that SIGTERM causes; the loop must deliver it and end.
        original_send = _link(nodes[1]).send

        def answer(data: bytes) -> None:
            original_send(data)
            if _link(nodes[1]).kinds()[-1:] == [STOP]:
                _link(nodes[1]).push(exited(1, -15) + DONE_FRAME)

        _link(nodes[1]).send = answer  # type: ignore[method-assign]
        outcome = supervise(sup, wake_fd, check_every=0.5)
    # Whether a's exit was read before the signal in the same wake-up is the kernel's choice.
    assert isinstance(outcome, Signalled) and outcome.signum == signal.SIGTERM
    assert sup.done and set(sup.exits) == {0, 1}


def test_an_agent_of_another_protocol_version_is_refused_in_one_line() -> None:
    node = fake_hosts({"a": 1})[0]
    _link(node).push(b"motd from a login shell\n" + hello(VERSION + 1) + encode(OUT, 0, b"x"))
    with pytest.raises(
        HostError, match=rf"host a: .*protocol version {VERSION + 1}.*this launcher {VERSION}"
    ):
        node.node.read()


def test_an_agent_of_protocol_version_2_is_refused_in_one_line() -> None:
    # Version 2 framed everything as HELLO still is: (kind, rank, length), no agent id.
    node = fake_hosts({"a": 1})[0]
    _link(node).push(hello(2) + HELLO_HEADER.pack(OUT, 0, 1) + b"x")
    with pytest.raises(HostError, match=rf"^host a: .*protocol version 2, this launcher {VERSION};"):
        node.node.read()


def test_frames_carry_the_node_s_agent_id_and_unknown_kinds_are_ignored() -> None:
    node = fake_hosts({"a": 1})[0]
    node.node.agent_id = 5
    node.node.send(STOP, StopRequest())
    assert [(f.kind, f.agent) for f in _link(node).sent] == [(STOP, 5)]
    sup = _supervisor([node])
    sup.on_frame(node, Frame(99, 5, 0, b"from a newer agent"), 0.0)
    assert sup.outcome() == Succeeded() and not sup.exits


def test_closing_sends_eof_to_every_agent_before_waiting_for_any() -> None:
    nodes = fake_hosts({"a": 1, "b": 1, "c": 1})
    nodes[2].drop()
    seen_at_first_close: list[bool] = []
    first = _link(nodes[0])
    first.close = lambda: seen_at_first_close.append(_link(nodes[1]).input_closed)  # type: ignore[method-assign]
    close_all([h.node for h in nodes])
    assert seen_at_first_close == [True]
    assert _link(nodes[1]).closed and not _link(nodes[2]).input_closed


def test_a_done_that_crossed_a_newcomer_on_the_wire_leaves_the_host_read() -> None:
    """DONE ends the agent's attempt; a rank sent there that has not exited was started after it, in the new
    attempt the agent began for it (an elastic reset's newcomer), so the host is still read until it ends."""
    nodes = fake_hosts({"a": 1, "b": 1})
    sup = _supervisor(nodes)
    spare = nodes[1]
    _exit(sup, spare, 1, 0, 0.0)
    spare.sent.add(7)  # the newcomer, sent as the agent ended its attempt
    _done(sup, spare)
    assert not spare.finished and sup.listening(spare)
    _exit(sup, spare, 7, 0, 1.0)
    _done(sup, spare, 1.0)
    assert spare.finished
