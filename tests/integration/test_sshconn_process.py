"""launcher.transport.sshconn where real processes are needed: the open-files limit (a process's own, so
raised in a fresh interpreter) and the known_hosts cache with keys made by ssh-keygen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import paramiko

from launcher.transport import sshconn
from tests.support import REPO


def test_known_hosts_are_parsed_once_and_again_when_the_file_changes(tmp_path: Path) -> None:
    first, second = (paramiko.Ed25519Key.from_private_key_file(str(k)) for k in _two_keys(tmp_path))
    known = tmp_path / "known_hosts"
    known.write_text(_line("h1", first) + _line("h1", second))
    cache = sshconn._KnownHostsCache()
    assert cache.keys_for([known], "h1") == {"ssh-ed25519": first}  # the first line of a type wins
    assert cache.keys_for([known], "h2") == {}
    with cache.lock:
        with open(known, "a") as f:
            f.write(_line("h2", second))
        cache.added(known, "h2", second)
    assert cache.keys_for([known], "h2") == {"ssh-ed25519": second}
    known.write_text(_line("h3", first))  # rewritten by someone else
    assert cache.keys_for([known], "h1") == {} and cache.keys_for([known], "h3") == {"ssh-ed25519": first}


def _line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def _two_keys(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / "k1", tmp_path / "k2"]
    for path in paths:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paths


def test_open_files_limit_is_raised_for_many_hosts() -> None:
    code = (
        "import resource\n"
        "from launcher.transport.sshconn import ensure_open_files\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "ensure_open_files(3 * 500)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=REPO).stdout.split()  # fmt: skip
    soft, hard = int(out[0]), int(out[1])
    assert soft == (min(1500 + 256, hard) if hard >= 0 else 1500 + 256)
