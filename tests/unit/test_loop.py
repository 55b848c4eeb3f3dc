"""The job's one wait loop with fake links (issue 24): the deadline, signals, liveness and `distrun stacks`
handled by the loop alike for every phase; the phases between attempts turn them into the job's outcome."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from launcher.agent.protocol import ProbeRequest
from launcher.core.result import Signalled, TimedOut
from launcher.errors import DeadlineReached, HostError, Interrupted
from launcher.job.pause import Pause
from launcher.runtime.control import ControlServer, JobBusy, ask_stacks
from launcher.runtime.loop import Deadline, Loop
from launcher.runtime.probe import probe
from launcher.signals import signal_pipe
from tests.fakes import FakeLink, fake_hosts

REQUEST = ProbeRequest(ports=1, cwd="/", route_to=None, python=None, heartbeat=0.0, dead_after=0.0)


def test_the_deadline_ends_a_phase_that_would_wait_longer() -> None:
    nodes = [h.node for h in fake_hosts({"a": 1})]
    with signal_pipe() as wake_fd:
        loop = Loop(wake_fd, deadline=Deadline(0.2, time.monotonic()), check_every=1.0)
        with pytest.raises(DeadlineReached, match="while starting: waiting for the agents' answers"):
            probe(nodes, [REQUEST], 60.0, loop)


def test_a_stopping_signal_interrupts_a_phase_before_any_rank_runs() -> None:
    nodes = [h.node for h in fake_hosts({"a": 1})]
    with signal_pipe() as wake_fd, pytest.raises(Interrupted) as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        probe(nodes, [REQUEST], 60.0, Loop(wake_fd, check_every=1.0))
    assert caught.value.exit_code == 143


def test_the_pause_runs_out_after_dropping_a_host_whose_link_closed() -> None:
    nodes = [h.node for h in fake_hosts({"a": 1, "b": 1})]
    cast(FakeLink, nodes[1].link).push(b"")  # the agent's link closed
    with signal_pipe() as wake_fd:
        pause = Pause(nodes, 0.3, dead_after=10.0)
        Loop(wake_fd, check_every=0.1).run(pause)
    assert pause.outcome is None
    assert nodes[1].lost and cast(FakeLink, nodes[1].link).aborted
    assert not nodes[0].lost


def test_a_host_silent_during_the_pause_is_dropped_not_fatal() -> None:
    nodes = [h.node for h in fake_hosts({"a": 1}, heartbeat=True)]
    with signal_pipe() as wake_fd:
        pause = Pause(nodes, 1.0, dead_after=0.2)
        Loop(wake_fd, check_every=0.05).run(pause)
    assert pause.outcome is None and nodes[0].lost


def test_a_signal_or_the_deadline_during_the_pause_is_the_jobs_outcome() -> None:
    nodes = [h.node for h in fake_hosts({"a": 1})]
    with signal_pipe() as wake_fd:
        pause = Pause(nodes, 60.0, dead_after=10.0)
        os.kill(os.getpid(), signal.SIGINT)
        Loop(wake_fd, check_every=1.0).run(pause)
        assert pause.outcome == Signalled(signal.SIGINT)
        pause = Pause(nodes, 60.0, dead_after=10.0)
        # A 5 s --timeout that began 4.9 s ago.
        Loop(wake_fd, deadline=Deadline(5.0, time.monotonic() - 4.9), check_every=1.0).run(pause)
        assert pause.outcome == TimedOut(5.0)


def test_a_phase_that_runs_no_rank_tells_distrun_stacks_what_it_is_doing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    nodes = [h.node for h in fake_hosts({"a": 1})]
    server = ControlServer()
    said: list[BaseException] = []

    def ask() -> None:
        try:
            ask_stacks(os.getpid(), 10.0)
        except JobBusy as err:
            said.append(err)

    client = threading.Thread(target=ask)
    try:
        with signal_pipe() as wake_fd:
            client.start()
            pause = Pause(nodes, 1.0, dead_after=10.0)
            Loop(wake_fd, check_every=0.1, control=server).run(pause)
        client.join(10.0)
    finally:
        server.close()
    assert len(said) == 1 and isinstance(said[0], JobBusy) and said[0].exit_code == 75
    assert f"distrun job {os.getpid()} runs no rank now: it is restarting in" in str(said[0])


def test_a_silent_host_is_lost_by_the_same_rule_in_any_phase() -> None:
    from launcher.runtime.loop import Phase
    from launcher.runtime.node import Node

    class Waiting(Phase[Node]):
        done = False

        def doing(self, now: float) -> str:
            return "waiting"

    nodes = [h.node for h in fake_hosts({"a": 1}, heartbeat=True)]
    with (
        signal_pipe() as wake_fd,
        pytest.raises(HostError, match="host a: no word from it for 0s while waiting"),
    ):
        Loop(wake_fd, check_every=0.05).run(Waiting([(nodes[0], nodes[0])], dead_after=0.2))
    assert nodes[0].lost


def test_an_fd_a_phase_begins_to_watch_while_the_loop_runs_is_read() -> None:
    """`Phase.add_watch` mid-run (the discovery script's next run while ranks run): the loop reads it from its
    next pass, and stops watching it when its reader says so."""
    nodes = [h.node for h in fake_hosts({"a": 1})]
    read_fd, write_fd = os.pipe()
    got: list[bytes] = []

    class Watching(Pause):
        began = False

        def on_tick(self, now: float) -> None:
            super().on_tick(now)
            if not self.began:
                self.began = True
                self.add_watch(read_fd, self.read)
                os.write(write_fd, b"h1:2\n")
                os.close(write_fd)

        def read(self, now: float) -> bool:
            data = os.read(read_fd, 100)
            got.append(data)
            return bool(data)

        @property
        def done(self) -> bool:
            return (bool(got) and got[-1] == b"") or self.outcome is not None

    with signal_pipe() as wake_fd:
        phase = Watching(nodes, 60.0, 60.0)
        Loop(wake_fd, deadline=Deadline(30.0, time.monotonic()), check_every=0.05).run(phase)
    os.close(read_fd)
    assert got == [b"h1:2\n", b""]
