"""A host still starting (its login shell running, its machine answering) is waited for past the probe's stall
time, within --startup-timeout, saying so; giving up names that limit and what the host was doing
(issue 27, item 7). Fake agents; tests/multihost/test_startup_ssh.py has real login shells."""

from __future__ import annotations

import logging
from typing import cast

import pytest

from launcher.agent.protocol import FACTS, Facts, ProbeRequest, encode_message
from launcher.core.hosts import Host
from launcher.errors import EXIT_HOST, HostError
from launcher.runtime.node import Node
from launcher.runtime.probe import probe
from launcher.runtime.startup import StartupTimedOut
from launcher.signals import signal_pipe
from tests.fakes import FakeLink, fake_hosts, hello

REQUEST = ProbeRequest(ports=1, cwd="/", heartbeat=1.0, dead_after=10.0)


class AnsweringMachine(FakeLink):
    """A host whose kernel acknowledges every byte we send, as a live host's does while its login runs."""

    def acked_ago(self) -> float:
        return 0.0

    def said_so_far(self) -> str:
        return "pyenv: cannot rehash: couldn't acquire lock"

    def diagnostics(self) -> str:
        return self.said_so_far()


def _facts(name: str) -> bytes:
    return encode_message(
        FACTS, Facts(hostname=name, python="python3", cwd_exists=True, gpu_count=0, free_ports=[1])
    )


def _hosts(alive: bool) -> list[Node]:
    """`a`, which answers at once, and `b`, which never does: alive (its machine answering) or not."""
    a = fake_hosts({"a": 1}, heartbeat=True)[0].node
    cast(FakeLink, a.link).push(hello() + _facts("a"))
    link = AnsweringMachine("b", heartbeat=True) if alive else FakeLink("b", heartbeat=True)
    return [a, Node(Host("b"), link, local=False)]


def test_a_host_still_logging_in_is_waited_for_then_named_with_the_limit_and_its_phase(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hosts = _hosts(alive=True)
    with (
        caplog.at_level(logging.WARNING),
        signal_pipe() as wake_fd,
        pytest.raises(StartupTimedOut) as caught,
    ):
        probe(hosts, [REQUEST] * 2, 0.2, wake_fd, startup=0.7)
    assert str(caught.value) == (
        "host b: still starting after 0.7s (--startup-timeout): its login shell was still running (its agent "
        "had not started); the shell's last line: pyenv: cannot rehash: couldn't acquire lock"
    )
    assert caught.value.host == "b" and caught.value.exit_code == EXIT_HOST
    waiting = [r.getMessage() for r in caplog.records if "still starting" in r.getMessage()]
    assert waiting, "the wait past the stall time is said"
    assert waiting[0].startswith(
        "waiting for 1 of 2 hosts still starting after 0s (1 in their login shell; b:"
    )
    assert waiting[0].endswith("giving up after 0.7s (--startup-timeout)")


def test_a_host_showing_no_sign_of_life_is_named_after_the_stall_time_as_before() -> None:
    hosts = _hosts(alive=False)
    with signal_pipe() as wake_fd, pytest.raises(HostError) as caught:
        probe(hosts, [REQUEST] * 2, 0.2, wake_fd, startup=30.0)
    assert not isinstance(caught.value, StartupTimedOut)
    assert str(caught.value) == "host b: no answer from the distrun agent within 0.2s; 1 of 2 answered"


def test_once_its_agent_runs_the_login_shell_s_last_line_is_no_cause() -> None:
    hosts = _hosts(alive=True)
    node = hosts[1]
    cast(FakeLink, node.link).push(hello())
    assert node.read() == []
    assert node.login_output() == "pyenv: cannot rehash: couldn't acquire lock"
    assert node.diagnostics() == "", "nothing the agent itself said"
