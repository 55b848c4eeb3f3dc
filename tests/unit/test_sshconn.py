"""The pure parts of launcher.transport.sshconn: resolution, ProxyJump parsing, all-or-nothing fan-out."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest

from launcher.config import SshOptions
from launcher.errors import HostError, UsageError
from launcher.hosts import Host
from launcher.progress import Progress
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


def fan_out(names: list[str], work: Callable[[str, sshconn.Window], Any], limit: int) -> dict[str, Any]:
    return sshconn.fan_out(names, work, lambda client: client.close(), limit=limit, phase="connecting")


def test_fan_out_is_all_or_nothing() -> None:
    opened: list[FakeClient] = []
    lock = threading.Lock()
    all_running = threading.Barrier(4, timeout=10)

    def connect(name: str, window: sshconn.Window) -> Any:
        all_running.wait()
        if name in ("b", "d"):
            raise HostError(f"{name}: connection refused")
        client = FakeClient(name)
        with lock:
            opened.append(client)
        return client

    with pytest.raises(HostError, match=r"^b: connection refused \(and 1 more host\(s\) failed\)$"):
        fan_out(["a", "b", "c", "d"], connect, limit=4)
    assert sorted(client.name for client in opened) == ["a", "c"]
    assert all(client.closed for client in opened)


def test_fan_out_stops_queued_hosts_after_a_failure() -> None:
    started: list[str] = []

    def connect(name: str, window: sshconn.Window) -> Any:
        started.append(name)
        if name == "a":
            raise HostError("a: connection refused")
        return FakeClient(name)

    with pytest.raises(HostError, match=r"^a: connection refused"):
        fan_out([*"abcdefghij"], connect, limit=1)
    assert len(started) < 10


def test_fan_out_returns_clients_in_the_order_given() -> None:
    clients = fan_out(["c", "a", "b"], lambda name, window: FakeClient(name), limit=8)
    assert list(clients) == ["c", "a", "b"]
    assert [client.name for client in clients.values()] == ["c", "a", "b"]


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


def test_fan_out_never_exceeds_its_window_and_reports_progress() -> None:
    lock = threading.Lock()
    in_flight, peak = 0, 0
    seen: list[Progress] = []

    def connect(name: str, window: sshconn.Window) -> Any:
        nonlocal in_flight, peak
        with window.slot():
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.001)  # let other workers pile up against the window
            with lock:
                in_flight -= 1
        if name == "x":
            raise HostError("x: connection refused")
        return FakeClient(name)

    names = [f"h{i}" for i in range(40)]
    clients = sshconn.fan_out(
        names, connect, FakeClient.close, limit=5, phase="connecting", progress=seen.append
    )
    assert len(clients) == 40
    assert 1 <= peak <= 5
    assert seen[0] == Progress("connecting", 40) and seen[-1] == Progress("connecting", 40, 40)
    assert [p.done for p in seen] == list(range(41))  # one report per host, from one thread, in order

    seen.clear()
    with pytest.raises(HostError, match=r"^x: connection refused"):
        sshconn.fan_out(
            ["a", "x"], connect, FakeClient.close, limit=1, phase="connecting", progress=seen.append
        )
    assert seen[-1].failed == 1
    assert str(seen[-1]) in ("connecting 1/2 hosts, 1 failed", "connecting 0/2 hosts, 1 failed")


def test_window_halves_once_per_burst_of_drops_and_widens_slowly() -> None:
    window = sshconn.Window(32)
    with window.slot() as first, window.slot() as second:
        assert first == sshconn.Ticket(epoch=0, crowded=False) and second.crowded
    window.dropped(first)
    window.dropped(second)  # the same burst: started before the first halving
    assert window.size == 16
    with window.slot() as later:
        pass
    window.dropped(later)
    assert window.size == 8
    for _ in range(8):
        window.completed()
    assert 8.5 < window.size < 9.5  # about one more slot per window's worth of completions
    for _ in range(2000):
        window.completed()
    assert window.size == 32


def test_a_shrunk_window_holds_back_new_handshakes_until_one_ends() -> None:
    window = sshconn.Window(2)
    window.dropped(sshconn.Ticket(epoch=0, crowded=True))  # now 1
    entered = threading.Event()
    first_done = threading.Event()
    order: list[str] = []

    def second() -> None:
        with window.slot():
            order.append("second")

    with window.slot():
        thread = threading.Thread(target=second)
        thread.start()
        entered.set()
        thread.join(0.2)  # an event cannot show a thread *not* entering; this only bounds the wait
        assert thread.is_alive() and order == []
        order.append("first")
        first_done.set()
    thread.join(10)
    assert order == ["first", "second"]


def test_abort_wakes_hosts_waiting_for_a_slot() -> None:
    window = sshconn.Window(1)
    outcome: list[str] = []

    def waiter() -> None:
        try:
            with window.slot():
                outcome.append("ran")
        except sshconn.Aborted:
            outcome.append("aborted")

    with window.slot():
        thread = threading.Thread(target=waiter)
        thread.start()
        window.abort()
        thread.join(10)
    assert outcome == ["aborted"]


def test_retries_give_up_at_once_when_another_host_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    window = sshconn.Window(4)

    def dropped(target: SshTarget, options: SshOptions, via: Any, password: str | None = None) -> Any:
        window.abort()  # another host fails while this one is in its handshake
        raise sshconn._Transient("SSH handshake with h:22 failed: Error reading SSH protocol banner")

    monkeypatch.setattr(sshconn, "_connect_once", dropped)
    target = resolve_target(Host("h"), SshOptions(), None)
    with pytest.raises(sshconn.Aborted):
        sshconn.connect_target(target, SshOptions(retries=5), window=window)
    assert window.size == 2  # the drop also narrowed the window


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
