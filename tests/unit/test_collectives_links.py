"""collectives.links on real loopback sockets: what appeared inside `owned()` is shut down by `cut()`, which
ends a wait blocked on it in another thread; sockets opened outside, listeners, and forgotten sockets are
left alone."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from collectives import links


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    links.forget()
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server
    links.forget()


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
    with links.owned():
        pass
    assert links.cut() == 0
    for each in (other, client, server_side):
        each.close()
