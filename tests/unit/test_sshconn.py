"""The pure parts of launcher.transport.sshconn: resolution, ProxyJump parsing, all-or-nothing fan-out."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import paramiko
import pytest

from launcher.config import SshOptions
from launcher.errors import HostError, UsageError
from launcher.hosts import Host
from launcher.transport import sshconn
from launcher.transport.sshconn import (
    JumpHop,
    SshTarget,
    connect_all,
    jump_targets,
    load_ssh_config,
    parse_jump,
    resolve_target,
)

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
    monkeypatch.setattr(sshconn, "SYSTEM_CONFIG", str(home / "no-system-config"))
    assert load_ssh_config(None) is None
    (home / ".ssh").mkdir()
    (home / ".ssh/config").write_text("Host x\n    User bob\n")
    loaded = load_ssh_config(None)
    assert loaded is not None
    assert loaded.lookup("x")["user"] == "bob"


def test_missing_identity_file_is_a_usage_error(home: Path) -> None:
    with pytest.raises(UsageError, match="identity file /nope/key does not exist"):
        connect_all([Host("h")], SshOptions(identity_files=(Path("/nope/key"),)))


def test_dns_failure_names_the_host(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    # No real lookup happens: the resolver is replaced, so no DNS traffic leaves the machine.
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(HostError, match=r"^nowhere: cannot resolve host name 'nowhere'") as info:
        connect_all([Host("nowhere")], SshOptions(config_file=_empty_config(home)))
    assert info.value.exit_code == 3


def _empty_config(home: Path) -> Path:
    path = home / "empty_config"
    path.write_text("")
    return path


class FakeClient:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_fan_out_is_all_or_nothing() -> None:
    opened: list[FakeClient] = []
    lock = threading.Lock()
    all_running = threading.Barrier(4, timeout=10)

    def connect(name: str, abort: threading.Event) -> Any:
        all_running.wait()
        if name in ("b", "d"):
            raise HostError(f"{name}: connection refused")
        client = FakeClient(name)
        with lock:
            opened.append(client)
        return client

    with pytest.raises(HostError, match=r"^b: connection refused \(and 1 more host\(s\) failed\)$"):
        sshconn._connect_parallel(["a", "b", "c", "d"], connect, max_parallel=4)
    assert sorted(client.name for client in opened) == ["a", "c"]
    assert all(client.closed for client in opened)


def test_fan_out_stops_queued_hosts_after_a_failure() -> None:
    started: list[str] = []

    def connect(name: str, abort: threading.Event) -> Any:
        started.append(name)
        if name == "a":
            raise HostError("a: connection refused")
        return FakeClient(name)

    with pytest.raises(HostError, match=r"^a: connection refused"):
        sshconn._connect_parallel([*"abcdefghij"], connect, max_parallel=1)
    assert len(started) < 10


def test_fan_out_returns_clients_in_the_order_given() -> None:
    clients = sshconn._connect_parallel(["c", "a", "b"], lambda name, abort: FakeClient(name), max_parallel=8)
    assert list(clients) == ["c", "a", "b"]
    assert [client.name for client in clients.values()] == ["c", "a", "b"]  # type: ignore[attr-defined]


def test_transient_failures_are_retried_then_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def flaky(target: SshTarget, options: SshOptions, via: Any, password: str | None) -> Any:
        attempts.append(1)
        raise sshconn._Transient("SSH handshake with h:22 failed: Error reading SSH protocol banner")

    monkeypatch.setattr(sshconn, "_connect_once", flaky)
    monkeypatch.setattr(sshconn, "_backoff", lambda attempt: 0.0)
    target = resolve_target(Host("h"), SshOptions(), None)
    with pytest.raises(HostError, match=r"^h: SSH handshake .* banner \(after 3 attempts\)"):
        sshconn.connect_target(target, SshOptions(retries=2))
    assert len(attempts) == 3


def test_final_failures_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def refused(target: SshTarget, options: SshOptions, via: Any, password: str | None) -> Any:
        attempts.append(1)
        raise sshconn._Refused("authentication refused for user root (tried ssh-agent)")

    monkeypatch.setattr(sshconn, "_connect_once", refused)
    target = resolve_target(Host("h"), SshOptions(), None)
    with pytest.raises(HostError, match=r"^h: authentication refused"):
        sshconn.connect_target(target, SshOptions(retries=5))
    assert len(attempts) == 1


def test_backoff_grows_and_is_capped() -> None:
    assert 0.05 <= sshconn._backoff(0) <= 0.15
    assert sshconn._backoff(10) <= sshconn.MAX_BACKOFF * 1.5


def test_importing_the_launcher_does_not_import_paramiko() -> None:
    code = "import sys, launcher, launcher.config, launcher.hosts; assert 'paramiko' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
