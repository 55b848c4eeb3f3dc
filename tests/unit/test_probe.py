"""supervise.probe with fake agents: its deadline follows progress instead of being one fixed timeout."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from launcher.agent.protocol import FACTS, Facts, ProbeRequest, encode_message
from launcher.core.progress import Progress, StallDeadline
from launcher.errors import HostError
from launcher.runtime.probe import probe
from launcher.signals import signal_pipe
from tests.fakes import FakeLink, fake_hosts, hello

REQUEST = ProbeRequest(ports=1, cwd="/", route_to=None, python=None, heartbeat=0.0, dead_after=0.0)


def facts_frame(name: str) -> bytes:
    return encode_message(FACTS, Facts(hostname=name, python="python3", cwd_exists=True, gpu_count=0,
                                       free_ports=[29500]))  # fmt: skip


def test_stall_deadline_moves_with_progress_only() -> None:
    deadline = StallDeadline(30.0, now=100.0)
    assert deadline.remaining(120.0) == 10.0
    deadline.progressed(125.0)  # an answer at 125 s: 30 s more from there, not from the start
    assert deadline.remaining(150.0) == 5.0
    assert deadline.remaining(160.0) < 0


def test_a_silent_host_is_named_after_the_others_answered() -> None:
    nodes = fake_hosts({"a": 1, "b": 1, "c": 1}, heartbeat=True)
    for node in nodes[:2]:
        cast(FakeLink, node.link).push(hello() + facts_frame(node.name))
    seen: list[Progress] = []
    with signal_pipe() as wake_fd, pytest.raises(HostError) as caught:
        probe([h.node for h in nodes], [REQUEST] * 3, 0.3, wake_fd, seen.append)
    assert str(caught.value) == "host c: no answer from the distrun agent within 0.3s; 2 of 3 answered"
    assert caught.value.host == "c"
    assert [p.done for p in seen] == [0, 1, 2] and seen[0] == Progress("waiting for agents", 3)


def test_answers_that_keep_coming_outlast_the_stall_time() -> None:
    # 8 answers 0.5 s apart: 3.5 s in all, longer than the 3 s stall, which a fixed timeout would fail.
    nodes = fake_hosts({f"h{i}": 1 for i in range(8)}, heartbeat=True)
    stop = threading.Event()

    def answer_one_by_one() -> None:
        for node in nodes:
            if stop.wait(0.5):
                return
            cast(FakeLink, node.link).push(hello() + facts_frame(node.name))

    thread = threading.Thread(target=answer_one_by_one)
    thread.start()
    try:
        with signal_pipe() as wake_fd:
            answers = probe([h.node for h in nodes], [REQUEST] * 8, 3.0, wake_fd)
    finally:
        stop.set()
        thread.join()
    assert [facts.hostname for facts in answers] == [n.name for n in nodes]
