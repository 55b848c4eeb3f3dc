"""collectives.links on real loopback sockets: what appeared inside `owned()` is shut down by `cut()`, which
ends a wait blocked on it in another thread; sockets opened outside, listeners, and forgotten sockets are
left alone. A cut reaches a group still forming (what appeared since its creation began), and a creation
that begins after a cut fails at once until a new world is named (`rearm`). A connect still waiting for its
peer is aborted, and so are the ones a creation opens again in its place."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from collectives import links
from collectives.errors import HorovodInternalError


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    links.forget()
    links.rearm()
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server
    links.forget()
    links.rearm()


def connected(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    return client, server_side


def test_cut_ends_a_blocked_receive_on_an_owned_socket_only(listener: socket.socket) -> None:
    with links.owned():
        mine, mine_peer = connected(listener)
    theirs, theirs_peer = connected(listener)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(mine.recv(1)))
    reader.start()
    assert links.cut() == 2, "both ends appeared inside owned(), as gloo's pairs between local ranks do"
    reader.join(10)
    assert not reader.is_alive() and got == [b""], "the blocked receive ended"
    assert mine_peer.recv(1) == b""
    theirs_peer.sendall(b"x")
    assert theirs.recv(1) == b"x", "a socket opened outside owned() still works"
    assert links.cut() == 0, "shut down already: nothing more to cut"
    for each in (mine, mine_peer, theirs, theirs_peer):
        each.close()


def test_listeners_and_forgotten_sockets_are_left_alone(listener: socket.socket) -> None:
    with links.owned():
        other = socket.create_server(("127.0.0.1", 0))
        client, server_side = connected(listener)
    links.forget()
    assert links.cut() == 0
    server_side.sendall(b"y")
    assert client.recv(1) == b"y"
    links.rearm()
    with links.owned():
        pass
    assert links.cut() == 0
    for each in (other, client, server_side):
        each.close()


def test_a_cut_reaches_a_group_still_forming(listener: socket.socket) -> None:
    """A peer of the new world died in its rendezvous: the creation's wait ends at once."""
    before, before_peer = connected(listener)  # opened before the creation: left alone
    got: list[bytes] = []
    with links.owned():
        forming, forming_peer = connected(listener)
        reader = threading.Thread(target=lambda: got.append(forming.recv(1)))
        reader.start()
        assert links.cut() == 2, "both ends appeared since the creation began"
        reader.join(10)
        assert not reader.is_alive() and got == [b""], "the rendezvous' wait ended"
    before_peer.sendall(b"z")
    assert before.recv(1) == b"z"
    for each in (before, before_peer, forming, forming_peer):
        each.close()


def test_after_a_cut_no_group_forms_until_a_new_world_is_named(listener: socket.socket) -> None:
    links.cut()
    with pytest.raises(HorovodInternalError, match="cannot form"), links.owned():
        pytest.fail("a creation after the cut must not begin")
    links.rearm()
    with links.owned():
        pass


def test_a_cut_ends_connects_still_waiting_for_their_peer_and_their_retries(listener: socket.socket) -> None:
    """A peer beyond a cut link drops the SYN: gloo's connect waits (and retries with a new socket, three
    times) until the group's timeout. A cut aborts each attempt at once."""
    # A listener whose accept queue is full drops the next SYN, as a host beyond a cut link does.
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        queued = socket.create_connection(full.getsockname())
        failures: list[OSError] = []

        def connect_with_retries() -> None:
            for _ in range(4):
                with socket.socket() as attempt:
                    try:
                        attempt.connect(full.getsockname())
                    except OSError as err:
                        failures.append(err)

        with links.owned():
            connecting = threading.Thread(target=connect_with_retries)
            connecting.start()
            while not failures and connecting.is_alive():
                links.cut()  # the connect may not have begun yet: a cut after it began aborts it
                connecting.join(0.05)
            connecting.join(10)
            assert not connecting.is_alive(), "every attempt ended well before the connect's own timeout"
        assert len(failures) == 4
        queued.close()
