"""A port whose peer accepts but never says a word (no SSH banner) fails once, within --ssh-connect-timeout,
instead of being retried for four times as long (issue 19)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from tests.support import clean_env, run_distrun


def _accept_all(server: socket.socket, accepted: list[socket.socket]) -> None:
    """Accept every connection and say nothing on it; until the server is closed."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        accepted.append(conn)


def test_a_silent_peer_fails_within_the_connect_timeout(tmp_path: Path) -> None:
    accepted: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        acceptor = threading.Thread(target=_accept_all, args=(silent, accepted), daemon=True)
        acceptor.start()
        env = {**clean_env(), "HOME": str(tmp_path)}  # nobody@localhost goes through SSH, to this port
        result = run_distrun(
            "-H", "nobody@localhost", "--ssh-port", str(port), "--ssh-connect-timeout", "2", "true", env=env
        )
        silent.shutdown(socket.SHUT_RDWR)
    acceptor.join(10)
    for conn in accepted:
        conn.close()
    said = result.stderr.decode()
    assert result.returncode == 3, said
    assert said == (
        f"distrun: error: localhost: unreachable: no SSH answer from localhost:{port} within 2s "
        "(is an SSH server listening there?)\n"
    )
    # Counted, not timed (distrun's own start-up takes seconds on a loaded machine): one try, not several.
    assert len(accepted) == 1, f"the silent peer was tried {len(accepted)} times"
