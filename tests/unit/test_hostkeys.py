"""Host keys (launcher.backends.ssh.hostkeys), no server: the one known_hosts reader, policies, messages."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from launcher.backends.ssh import hostkeys
from launcher.backends.ssh.config import SshTarget
from launcher.backends.ssh.options import HostKeyPolicy


def test_known_hosts_are_parsed_once_and_again_when_the_file_changes(tmp_path: Path) -> None:
    first, second = _key(), _key()
    known = tmp_path / "known_hosts"
    known.write_text(_line("h1", first) + _line("h1", second))
    cache = hostkeys.KnownHosts()
    assert cache.keys_for([known], "h1") == {first.get_name(): first}  # the first line of a type wins
    assert cache.keys_for([known], "h2") == {}
    with cache.lock:
        with open(known, "a") as f:
            f.write(_line("h2", second))
        cache.added(known, "h2", second)
    assert cache.keys_for([known], "h2") == {second.get_name(): second}
    known.write_text(_line("h3", first))  # rewritten by someone else
    assert cache.keys_for([known], "h1") == {} and cache.keys_for([known], "h3") == {first.get_name(): first}


def _line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _target(tmp_path: Path, port: int = 22, policy: HostKeyPolicy = "accept-new") -> SshTarget:
    return SshTarget(
        host="node1",
        hostname="10.0.0.7",
        port=port,
        user="alice",
        identity_files=(),
        host_key_policy=policy,
        known_hosts_files=(tmp_path / "user_known",),
        global_known_hosts_files=(tmp_path / "global_known",),
    )


@pytest.mark.parametrize(
    ("port", "file", "filed_as", "hashed", "known"),  # the target is 10.0.0.7 at `port`
    [
        (22, "user_known", "10.0.0.7", False, True),
        (22, "global_known", "10.0.0.7", False, True),
        (22, "user_known", "10.0.0.7", True, True),  # HashKnownHosts entries match too
        (2222, "user_known", "[10.0.0.7]:2222", False, True),
        (2222, "user_known", "10.0.0.7", False, False),  # a key for port 22 is not one for 2222
        (22, "user_known", "10.0.0.8", False, False),
    ],
)
def test_has_known_key(
    tmp_path: Path, port: int, file: str, filed_as: str, *, hashed: bool, known: bool
) -> None:
    entry = paramiko.HostKeys.hash_host(filed_as) if hashed else filed_as
    (tmp_path / file).write_text(_line(entry, _key()))
    assert hostkeys.has_known_key(_target(tmp_path, port)) is known


def test_accept_new_appends_the_key_and_knows_it_from_then_on(tmp_path: Path) -> None:
    key = _key()
    target = replace(_target(tmp_path), hash_known_hosts=True)
    assert not hostkeys.has_known_key(target)
    hostkeys.HostKeyPolicy(target).missing_host_key(paramiko.SSHClient(), "10.0.0.7", key)
    written = (tmp_path / "user_known").read_text()
    assert written.startswith("|1|") and key.get_base64() in written  # hashed, as HashKnownHosts asks
    assert hostkeys.has_known_key(target)


def test_strict_refuses_an_unknown_key_and_says_how_to_add_it(tmp_path: Path) -> None:
    key = _key()
    target = _target(tmp_path, port=2222, policy="strict")
    with pytest.raises(hostkeys.UnknownHostKey, match=r"ssh-keyscan -p 2222 10\.0\.0\.7 >> .*user_known"):
        hostkeys.HostKeyPolicy(target).missing_host_key(paramiko.SSHClient(), "[10.0.0.7]:2222", key)
    assert not (tmp_path / "user_known").exists()


def test_a_changed_key_names_every_file_that_holds_the_old_one(tmp_path: Path) -> None:
    old, new = _key(), _key()
    for file in ("user_known", "global_known"):
        (tmp_path / file).write_text(_line("10.0.0.7", old))
    target = _target(tmp_path)
    reason = hostkeys.changed_key_reason(target, paramiko.BadHostKeyException("10.0.0.7", new, old))
    assert reason.startswith("host key for 10.0.0.7 has CHANGED")
    assert f"ssh-keygen -R 10.0.0.7 -f {tmp_path / 'user_known'}` or `ssh-keygen -R 10.0.0.7 -f" in reason
    assert str(tmp_path / "global_known") in reason
