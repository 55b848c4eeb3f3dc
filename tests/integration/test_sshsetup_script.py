"""The command `distrun ssh-setup` sends to install a key, run by a real sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launcher.backends.ssh.setup import INSTALL_KEY


def install(home: Path, key: str) -> str:
    """The exact command ssh-setup sends, run by a real sh with the key on stdin."""
    result = subprocess.run(
        ["sh", "-c", INSTALL_KEY],
        input=key + "\n",
        capture_output=True,
        text=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return result.stdout.strip()


def test_install_script_is_idempotent_and_keeps_other_keys(tmp_path: Path) -> None:
    authorized = tmp_path / ".ssh" / "authorized_keys"
    assert install(tmp_path, "ssh-ed25519 AAAAkey1 me@a") == "added"
    assert (tmp_path / ".ssh").stat().st_mode & 0o777 == 0o700
    assert authorized.stat().st_mode & 0o777 == 0o600
    assert install(tmp_path, "ssh-ed25519 AAAAkey1 other-comment") == "present"
    authorized.write_text(authorized.read_text() + "ssh-rsa AAAAold no-newline")
    assert install(tmp_path, "ssh-ed25519 AAAAkey2 me@b") == "added"
    assert authorized.read_text().splitlines() == [
        "ssh-ed25519 AAAAkey1 me@a",
        "ssh-rsa AAAAold no-newline",
        "ssh-ed25519 AAAAkey2 me@b",
    ]
