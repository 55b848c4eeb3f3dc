"""Agents dialing home (launcher.agent.homing) to a launcher's Home (launcher.backends.dialhome), over
loopback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from launcher.agent.homing import dial
from launcher.backends.dialhome import Home
from launcher.errors import HostError


def _invitation(home: Home) -> dict[str, object]:
    return dict(json.loads(home.invitation()))


@contextmanager
def _dialing(invitation: dict[str, object], name: str, then: bytes = b"") -> Iterator[Callable[[], object]]:
    """`name`'s agent dials in a thread; the function waits for it and returns its socket, or its error."""
    result: list[object] = []

    def agent() -> None:
        try:
            sock = dial(invitation, name)
        except OSError as err:
            result.append(err)
            return
        sock.sendall(then)
        result.append(sock)

    def outcome() -> object:
        thread.join(10)
        return result[0]

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(10)
        for item in result:
            if isinstance(item, socket.socket):
                item.close()


def test_every_expected_agent_is_admitted_with_what_it_sent_right_after_the_handshake() -> None:
    home = Home(["node1", "node2"], ["127.0.0.1"])
    invitation = _invitation(home)
    with _dialing(invitation, "node2", b"hello") as second, _dialing(invitation, "node1") as first:
        links = home.gather(10, lambda: None, lambda: "")
        assert list(links) == ["node1", "node2"]
        assert links["node2"].recv() == b"hello"
        links["node1"].send(b"probe")
        for link in links.values():
            link.close_input()
        agent1 = first()
        assert isinstance(agent1, socket.socket) and isinstance(second(), socket.socket)
        assert agent1.recv(100) == b"probe"
        assert agent1.recv(100) == b""  # EOF: the launcher closed its side
    for link in links.values():
        link.abort()
    assert all(link.closed for link in links.values())


def test_an_agent_with_the_wrong_secret_is_refused_and_so_is_a_launcher_with_it() -> None:
    home = Home(["node1"], ["127.0.0.1"])
    forged = {**_invitation(home), "secret": "00" * 32}
    with _dialing(forged, "node1") as result:
        with pytest.raises(HostError, match="no distrun agent dialed in"):
            home.gather(0.5, lambda: None, lambda: "")
        # Nor did the agent trust a launcher that could not prove the secret it was given.
        assert isinstance(result(), OSError)


def test_a_stranger_does_not_hold_up_or_replace_the_expected_agent() -> None:
    home = Home(["node1"], ["127.0.0.1"])
    invitation = _invitation(home)
    with socket.create_connection(("127.0.0.1", int(str(invitation["port"])))) as stranger:
        stranger.sendall(b"GET / HTTP/1.0\n\n")
        with _dialing(invitation, "node9") as unexpected, _dialing(invitation, "node1") as expected:
            links = home.gather(10, lambda: None, lambda: "")
            assert isinstance(expected(), socket.socket) and isinstance(unexpected(), OSError)
    assert list(links) == ["node1"]
    links["node1"].abort()


def test_the_starter_ending_early_names_a_missing_host_with_its_last_words() -> None:
    home = Home(["node1", "node2"], ["127.0.0.1"])
    with pytest.raises(
        HostError, match=r"^host node1: the distrun agent exited before answering: no python$"
    ):
        home.gather(10, lambda: "srun exited with code 1", lambda: "no python")
