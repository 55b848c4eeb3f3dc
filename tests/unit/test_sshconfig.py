"""ssh_config resolution (launcher.backends.ssh.config): precedence, policies, ProxyJump, the memo config."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from launcher.backends.ssh import config as sshconfig
from launcher.backends.ssh.config import (
    JumpHop,
    Route,
    SshTarget,
    jump_targets,
    load_ssh_config,
    parse_jump,
    resolve_target,
    routes,
)
from launcher.backends.ssh.options import SshOptions
from launcher.core.hosts import Host
from launcher.errors import UsageError

CONFIG = """
Host web
    HostName web.internal
    User deploy
    Port 2222
    IdentityFile ~/.ssh/web_key
    StrictHostKeyChecking yes
    UserKnownHostsFile ~/kh1 /tmp/kh2

Host lax
    StrictHostKeyChecking no

Host newbie
    StrictHostKeyChecking accept-new
    HashKnownHosts yes

Host behind
    HostName 10.0.0.5
    ProxyJump ops@bastion:2200
    HostKeyAlias behind-alias
    IdentitiesOnly yes

Host bastion
    HostName bastion.example
    User admin

Host odd
    StrictHostKeyChecking sometimes
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    return tmp_path


@pytest.fixture
def config(home: Path) -> paramiko.SSHConfig:
    path = home / "ssh_config"
    path.write_text(CONFIG)
    loaded = load_ssh_config(path)
    assert loaded is not None
    return loaded


def test_defaults_without_any_config(home: Path) -> None:
    target = resolve_target(Host("node1"), SshOptions(), None)
    assert target == SshTarget(
        host="node1",
        hostname="node1",
        port=22,
        user="alice",
        identity_files=(),
        host_key_policy="accept-new",
        proxy_jump=None,
        known_hosts_files=(home / ".ssh/known_hosts", home / ".ssh/known_hosts2"),
        global_known_hosts_files=(Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2")),
    )
    assert target.known_hosts_name == "node1"


def test_config_supplies_hostname_user_port_keys_and_policy(home: Path, config: paramiko.SSHConfig) -> None:
    target = resolve_target(Host("web"), SshOptions(), config)
    assert (target.host, target.hostname, target.user, target.port) == ("web", "web.internal", "deploy", 2222)
    assert target.identity_files == (home / ".ssh/web_key",)
    assert target.host_key_policy == "strict"
    assert target.known_hosts_files == (home / "kh1", Path("/tmp/kh2"))
    assert target.known_hosts_name == "[web.internal]:2222"


def test_what_the_user_wrote_beats_the_config(home: Path, config: paramiko.SSHConfig) -> None:
    options = SshOptions(
        port=2022,
        identity_files=(Path("/keys/a"),),
        host_key_policy="ignore",
        known_hosts_file=Path("/kh/mine"),
    )
    target = resolve_target(Host("web", user="root"), options, config)
    assert target.user == "root"
    assert target.port == 2022
    assert target.identity_files == (Path("/keys/a"), home / ".ssh/web_key")  # options first, both offered
    assert target.host_key_policy == "ignore"
    assert target.known_hosts_files == (Path("/kh/mine"),)


@pytest.mark.parametrize(
    ("name", "policy"),
    [("web", "strict"), ("lax", "ignore"), ("newbie", "accept-new"), ("unlisted", "accept-new")],
)
def test_strict_host_key_checking_maps_to_policy(config: paramiko.SSHConfig, name: str, policy: str) -> None:
    assert resolve_target(Host(name), SshOptions(), config).host_key_policy == policy


def test_unknown_strict_value_is_a_usage_error(config: paramiko.SSHConfig) -> None:
    with pytest.raises(UsageError, match="odd: unknown StrictHostKeyChecking value 'sometimes'"):
        resolve_target(Host("odd"), SshOptions(), config)


def test_alias_identities_only_and_hashing(config: paramiko.SSHConfig) -> None:
    target = resolve_target(Host("behind"), SshOptions(), config)
    assert target.known_hosts_name == "behind-alias"
    assert target.identities_only
    assert resolve_target(Host("newbie"), SshOptions(), config).hash_known_hosts


def test_proxy_jump_hops_resolve_through_the_config(config: paramiko.SSHConfig) -> None:
    target = resolve_target(Host("behind"), SshOptions(port=2022), config)
    assert target.proxy_jump == "ops@bastion:2200"
    (hop,) = jump_targets(target, SshOptions(port=2022), config)
    # The jump spec's user and port win; the launcher's port option is for the destination only.
    assert (hop.host, hop.hostname, hop.user, hop.port) == ("bastion", "bastion.example", "ops", 2200)
    assert hop.proxy_jump is None


@pytest.mark.parametrize(
    ("spec", "hops"),
    [
        ("bastion", [JumpHop("bastion")]),
        ("u@b:2200", [JumpHop("b", "u", 2200)]),
        ("ssh://u@b:22", [JumpHop("b", "u", 22)]),
        ("[fe80::1]:2222,u@[::1]", [JumpHop("fe80::1", None, 2222), JumpHop("::1", "u", None)]),
        ("a, b:23", [JumpHop("a"), JumpHop("b", None, 23)]),
    ],
)
def test_parse_jump(spec: str, hops: list[JumpHop]) -> None:
    assert parse_jump(spec) == hops


@pytest.mark.parametrize("spec", ["b:port", "u@", "b:0", "b:70000"])
def test_parse_jump_rejects_garbage(spec: str) -> None:
    with pytest.raises(UsageError, match="ProxyJump"):
        parse_jump(spec)


def test_explicit_config_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_ssh_config(tmp_path / "missing")


def test_no_config_anywhere_is_none(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sshconfig, "SYSTEM_CONFIG", str(home / "no-system-config"))
    assert load_ssh_config(None) is None
    (home / ".ssh").mkdir()
    (home / ".ssh/config").write_text("Host x\n    User bob\n")
    loaded = load_ssh_config(None)
    assert loaded is not None
    assert loaded.lookup("x")["user"] == "bob"


def test_ssh_config_is_looked_up_once_per_host_until_it_changes(home: Path) -> None:
    path = home / "ssh_config"
    path.write_text("Host web\n    HostName one.internal\n")
    config = load_ssh_config(path)
    assert config is not None and load_ssh_config(path) is config
    looked_up = config.lookup("web")
    looked_up["hostname"] = "changed by a caller"
    assert config.lookup("web")["hostname"] == "one.internal"  # callers get copies
    path.write_text("Host web\n    HostName another.internal\n")
    changed = load_ssh_config(path)
    assert changed is not config and changed is not None
    assert changed.lookup("web")["hostname"] == "another.internal"


def test_routes_resolve_each_name_once_with_its_hops(home: Path) -> None:
    path = home / "ssh_config"
    path.write_text(CONFIG)
    found = routes([Host("behind"), Host("web"), Host("behind", user="root")], SshOptions(config_file=path))
    assert list(found) == ["behind", "web"]  # one route per name, in the order given
    assert found["behind"].target.user == "root"  # the last entry for a name wins, as the fan-out's did
    assert [hop.hostname for hop in found["behind"].jumps] == ["bastion.example"]
    assert found["web"] == Route(resolve_target(Host("web"), SshOptions(), load_ssh_config(path)))
