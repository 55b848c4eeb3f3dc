"""What the supervisor sends every host for each signal distrun receives (fake links, no processes)."""

from __future__ import annotations

import signal

import pytest

from launcher.agent.protocol import SIGNAL, STOP, SignalRequest, StopRequest, decode_message
from launcher.core.result import Signalled
from launcher.job.supervise import Supervisor
from launcher.runtime.node import HostAttempt
from tests.fakes import CapturedFd, FakeLink, fake_hosts, memory_relay


def _setup(hosts: dict[str, int]) -> tuple[list[HostAttempt], Supervisor, CapturedFd]:
    nodes = fake_hosts(hosts)
    relay, _, err = memory_relay({s.rank: n.name for n in nodes for s in n.slots})
    return nodes, Supervisor(nodes, relay, grace=4.0, dead_after=10.0), err


def _sent(node: HostAttempt, kind: int) -> list[bytes]:
    assert isinstance(node.link, FakeLink)
    return [frame.payload for frame in node.link.sent if frame.kind == kind]


def test_ctrl_c_asks_for_sigint_first_and_says_so_once() -> None:
    nodes, sup, err = _setup({"a": 1, "b": 1})
    sup.on_signal(signal.SIGINT, 0.0)
    sup.on_signal(signal.SIGINT, 0.1)  # the second one kills; it does not repeat the message
    for node in nodes:
        assert [decode_message(StopRequest, p).first for p in _sent(node, STOP)] == ["SIGINT"]
    assert err.getvalue() == (
        b"distrun: SIGINT: stopping every rank (grace period 4s); "
        b"press Ctrl-C again to kill every rank at once\n"
    )


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGQUIT, 131)]
)
def test_other_stopping_signals_ask_for_sigterm(sig: signal.Signals, code: int) -> None:
    nodes, sup, _ = _setup({"a": 2})
    sup.on_signal(sig, 0.0)
    assert [decode_message(StopRequest, p).first for p in _sent(nodes[0], STOP)] == ["SIGTERM"]
    outcome = sup.outcome()
    assert isinstance(outcome, Signalled) and outcome.exit_code == code and outcome.stopped == (0, 1)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT])
def test_user_signals_are_forwarded_and_the_job_goes_on(sig: signal.Signals) -> None:
    nodes, sup, _ = _setup({"a": 1, "b": 1})
    sup.on_signal(sig, 0.0)
    for node in nodes:
        assert [decode_message(SignalRequest, p).name for p in _sent(node, SIGNAL)] == [sig.name]
        assert _sent(node, STOP) == []
    assert sup.cause is None and not sup.suspend


def test_ctrl_z_stops_the_ranks_before_distrun_stops_itself() -> None:
    nodes, sup, _ = _setup({"a": 1})
    sup.on_signal(signal.SIGTSTP, 0.0)
    assert [decode_message(SignalRequest, p).name for p in _sent(nodes[0], SIGNAL)] == ["SIGSTOP"]
    assert sup.suspend and sup.cause is None


def test_a_finished_host_is_sent_nothing() -> None:
    nodes, sup, _ = _setup({"a": 1, "b": 1})
    nodes[0].finished = True
    sup.on_signal(signal.SIGUSR1, 0.0)
    assert _sent(nodes[0], SIGNAL) == [] and len(_sent(nodes[1], SIGNAL)) == 1
