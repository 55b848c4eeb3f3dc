from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends.ssh.setup import ensure_key
from launcher.errors import UsageError


def test_ensure_key_creates_an_ed25519_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    key = ensure_key(())
    assert key.created and key.path == tmp_path / ".ssh" / "id_ed25519"
    assert key.path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / ".ssh").stat().st_mode & 0o777 == 0o700
    assert key.public.startswith("ssh-ed25519 AAAA")
    assert key.path.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    again = ensure_key(())
    assert (again.created, again.path, again.public) == (False, key.path, key.public)


def test_ensure_key_takes_an_existing_rsa_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text("private")
    (tmp_path / ".ssh" / "id_rsa.pub").write_text("ssh-rsa AAAAB3 me@box\n")
    key = ensure_key(())
    assert (key.created, key.public) == (False, "ssh-rsa AAAAB3 me@box")


def test_ensure_key_with_a_missing_identity_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"identity file .*id_none does not exist"):
        ensure_key((tmp_path / "id_none",))
