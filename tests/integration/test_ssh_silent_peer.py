"""A port whose peer accepts but never says a word (no SSH banner) fails once, within --ssh-connect-timeout,
instead of being retried for four times as long (issue 19)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.support import clean_env, run_distrun


def test_a_silent_peer_fails_within_the_connect_timeout(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        env = {**clean_env(), "HOME": str(tmp_path)}  # nobody@localhost goes through SSH, to this port
        started = time.monotonic()
        result = run_distrun(
            "-H", "nobody@localhost", "--ssh-port", str(port), "--ssh-connect-timeout", "2", "true", env=env
        )
        took = time.monotonic() - started
    said = result.stderr.decode()
    assert result.returncode == 3, said
    assert said == (
        f"distrun: error: localhost: unreachable: no SSH answer from localhost:{port} within 2s "
        "(is an SSH server listening there?)\n"
    )
    assert took < 7, f"{took:.1f}s: the silent peer was tried again and again"
