"""connect_all against real OpenSSH servers on the simulated cluster."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from launcher.backends.ssh import connect as sshconn
from launcher.backends.ssh.connect import connect_all
from launcher.backends.ssh.options import SshOptions
from launcher.core.hosts import Host
from launcher.core.progress import Progress
from launcher.errors import HostError
from tests.multihost.cluster import Cluster

pytestmark = pytest.mark.multihost


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ssh-agent and an empty ~/.ssh: only what a test configures can authenticate or be trusted."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def write_config(
    path: Path, cluster: Cluster, aliases: dict[str, str], *extra: str, key: Path | None = None
) -> Path:
    """An ssh_config mapping each alias to a HostName; the cluster's key and known_hosts unless overridden."""
    blocks = [f"Host {alias}\n    HostName {hostname}\n" for alias, hostname in aliases.items()]
    common = [
        "User root",
        f"IdentityFile {key or cluster.key_path}",
        "IdentitiesOnly yes",
        f"UserKnownHostsFile {cluster.known_hosts_path}",
        *extra,
    ]
    path.write_text("".join(blocks) + "Host *\n" + "".join(f"    {line}\n" for line in common))
    return path


def run(client: paramiko.SSHClient, command: str) -> str:
    _, out, _ = client.exec_command(command, timeout=10)
    return out.read().decode().strip()


@pytest.fixture
def connected() -> Iterator[list[dict[str, paramiko.SSHClient]]]:
    """Collects connect_all results and closes them after the test, pass or fail."""
    results: list[dict[str, paramiko.SSHClient]] = []
    yield results
    for clients in results:
        for client in clients.values():
            client.close()


def test_connects_to_every_host_by_name(
    cluster: Cluster, connected: list[dict[str, paramiko.SSHClient]]
) -> None:
    options = SshOptions(config_file=cluster.ssh_config_path, host_key_policy="strict")
    clients = connect_all([Host("h1", slots=2), Host("h2"), Host("h3"), Host("h1")], options)
    connected.append(clients)
    assert list(clients) == ["h1", "h2", "h3"]  # one connection per distinct host, in the order given
    for name, client in clients.items():
        assert run(client, "hostname") == name
        transport = client.get_transport()
        assert transport is not None and transport.is_active()
        assert getattr(client, "peer_addr", None) == cluster.addr(name)


def test_user_home_ssh_config_is_honoured(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, connected: list[dict[str, paramiko.SSHClient]]
) -> None:
    monkeypatch.setenv("HOME", str(cluster.home))  # ~/.ssh/config, known_hosts and id_ed25519 of the cluster
    connected.append(clients := connect_all([Host("h2"), Host("h3")], SshOptions()))
    assert run(clients["h3"], "hostname") == "h3"


def test_connection_close_leaves_nothing_on_the_hosts(cluster: Cluster) -> None:
    clients = connect_all([Host(h) for h in cluster.hosts], SshOptions(config_file=cluster.ssh_config_path))
    assert all(cluster.processes(h) for h in cluster.hosts)  # each connection has its sshd process
    for client in clients.values():
        client.close()
    assert cluster.wait_clean() == {}


def test_wrong_key_is_refused_naming_the_host(cluster: Cluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    config = write_config(tmp_path / "config", cluster, {"h2": cluster.addr("h2")}, key=wrong)
    started = time.monotonic()
    with pytest.raises(HostError, match=r"^h2: authentication refused for user root") as info:
        connect_all([Host("h2")], SshOptions(config_file=config, retries=3))
    assert info.value.exit_code == 3
    assert str(wrong) in str(info.value)
    assert time.monotonic() - started < 5  # not retried
    assert cluster.wait_clean() == {}


def test_no_key_at_all_is_an_auth_failure_not_retried(cluster: Cluster, tmp_path: Path) -> None:
    config = write_config(tmp_path / "config", cluster, {"h2": cluster.addr("h2")}, key=tmp_path / "absent")
    started = time.monotonic()
    with pytest.raises(HostError, match=r"^h2: authentication refused for user root: no usable key"):
        connect_all([Host("h2")], SshOptions(config_file=config))
    assert time.monotonic() - started < 5


def test_user_from_host_spec_wins_over_config(cluster: Cluster) -> None:
    with pytest.raises(HostError, match=r"^h1: authentication refused for user nosuchuser"):
        connect_all([Host("h1", user="nosuchuser")], SshOptions(config_file=cluster.ssh_config_path))


def test_unknown_host_key_is_refused_under_strict(cluster: Cluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.touch()
    options = SshOptions(
        config_file=cluster.ssh_config_path, known_hosts_file=empty, host_key_policy="strict"
    )
    with pytest.raises(HostError, match=r"^h1: host key for 198\.18\.\d+\.11 .* is not in .*strict") as info:
        connect_all([Host("h1")], options)
    assert "ssh-keyscan" in str(info.value)
    assert empty.read_text() == ""
    # The cluster's ssh_config says StrictHostKeyChecking yes: the same refusal without the option.
    with pytest.raises(HostError, match="is not in"):
        connect_all([Host("h1")], SshOptions(config_file=cluster.ssh_config_path, known_hosts_file=empty))


@pytest.mark.parametrize("hashed", [False, True])
def test_accept_new_records_the_key_and_then_trusts_it(
    cluster: Cluster, tmp_path: Path, hashed: bool, connected: list[dict[str, paramiko.SSHClient]]
) -> None:
    known = tmp_path / "ssh" / "known_hosts"  # directory does not exist yet either
    extra = ["HashKnownHosts yes"] if hashed else []
    config = write_config(tmp_path / "config", cluster, {"h2": cluster.addr("h2")}, *extra)
    options = SshOptions(config_file=config, known_hosts_file=known, host_key_policy="accept-new")
    connected.append(connect_all([Host("h2")], options))
    entry = known.read_text()
    assert entry.count("\n") == 1
    assert entry.startswith("|1|" if hashed else f"{cluster.addr('h2')} ssh-ed25519 ")
    assert entry.split()[1:] == cluster.host_key("h2").split()
    strict = SshOptions(config_file=config, known_hosts_file=known, host_key_policy="strict")
    connected.append(connect_all([Host("h2")], strict))
    assert known.read_text() == entry  # nothing appended twice


def test_changed_host_key_is_refused_with_a_fix(
    make_cluster: Callable[..., Cluster], connected: list[dict[str, paramiko.SSHClient]]
) -> None:
    cluster = make_cluster(1)
    cluster.rotate_host_key("h1")
    for policy in ("strict", "accept-new"):
        options = SshOptions(config_file=cluster.ssh_config_path, host_key_policy=policy)  # type: ignore[arg-type]
        with pytest.raises(HostError, match=r"^h1: host key for 198\.18\.\d+\.11 has CHANGED") as info:
            connect_all([Host("h1")], options)
        assert f"ssh-keygen -R {cluster.addr('h1')} -f {cluster.known_hosts_path}" in str(info.value)
    before = cluster.known_hosts_path.read_text()
    ignore = SshOptions(config_file=cluster.ssh_config_path, host_key_policy="ignore")
    connected.append(clients := connect_all([Host("h1")], ignore))
    assert run(clients["h1"], "hostname") == "h1"
    assert cluster.known_hosts_path.read_text() == before  # ignore never writes


def test_stopped_sshd_is_reported_unreachable_quickly(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(2)
    cluster.stop_sshd("h2")
    started = time.monotonic()
    with pytest.raises(HostError, match=r"^h2: connection refused by 198\.18\.\d+\.12:22"):
        connect_all(
            [Host("h1"), Host("h2")], SshOptions(config_file=cluster.ssh_config_path, connect_timeout=3)
        )
    assert time.monotonic() - started < 3
    assert cluster.wait_clean() == {}  # h1's connection was closed, not leaked


def test_host_off_the_network_times_out_and_nothing_stays_open(cluster: Cluster) -> None:
    cluster.link_down("h3")
    try:
        started = time.monotonic()
        options = SshOptions(config_file=cluster.ssh_config_path, connect_timeout=2)
        with pytest.raises(HostError, match=r"^h3: unreachable"):
            connect_all([Host("h1"), Host("h2"), Host("h3")], options)
        assert time.monotonic() - started < 2 + 1.5
    finally:
        cluster.link_up("h3")
    assert cluster.wait_clean() == {}


def test_proxy_jump_reaches_a_name_only_the_jump_host_resolves(
    cluster: Cluster, tmp_path: Path, connected: list[dict[str, paramiko.SSHClient]]
) -> None:
    # The launch machine cannot resolve `h2`; h1 can, so success proves the tunnel went through h1.
    config = write_config(
        tmp_path / "config",
        cluster,
        {"jump": cluster.addr("h1"), "behind": "h2"},
        "StrictHostKeyChecking yes",
    )
    config.write_text(config.read_text().replace("Host behind\n", "Host behind\n    ProxyJump jump\n"))
    connected.append(clients := connect_all([Host("behind")], SshOptions(config_file=config)))
    client = clients["behind"]
    assert run(client, "hostname") == "h2"
    assert getattr(client, "peer_addr", "unset") is None  # tunnelled: no direct peer address
    assert len(cluster.processes("h1")) >= 1  # the jump connection
    client.close()
    assert cluster.wait_clean() == {}  # closing the target closed the jump connection too


def test_parallel_handshakes_survive_sshd_max_startups(
    cluster: Cluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    connected: list[dict[str, paramiko.SSHClient]],
) -> None:
    # 16 names for one host, so 16 handshakes hit one sshd with its default MaxStartups 10:30:100 at once.
    aliases = {f"n{i}": cluster.addr("h1") for i in range(16)}
    config = write_config(tmp_path / "config", cluster, aliases)
    caplog.set_level(logging.DEBUG, logger="launcher.backends.ssh.connect")
    options = SshOptions(config_file=config, max_parallel=16)  # default retries
    connected.append(clients := connect_all([Host(alias) for alias in aliases], options))
    assert len(clients) == 16
    assert {run(client, "hostname") for client in clients.values()} == {"h1"}
    retried = sum("retrying" in record.getMessage() for record in caplog.records)
    logging.getLogger(__name__).info("%d handshakes were dropped by sshd and retried", retried)


def test_fan_out_to_many_hosts_keeps_to_its_window(
    make_cluster: Callable[..., Cluster],
    monkeypatch: pytest.MonkeyPatch,
    connected: list[dict[str, paramiko.SSHClient]],
) -> None:
    cluster = make_cluster(24, login_rc=False)
    real_connect_once = sshconn._connect_once
    lock = threading.Lock()
    in_flight, peak = 0, 0

    def counted(*args: Any) -> paramiko.SSHClient:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return real_connect_once(*args)
        finally:
            with lock:
                in_flight -= 1

    monkeypatch.setattr(sshconn, "_connect_once", counted)
    seen: list[Progress] = []
    options = SshOptions(config_file=cluster.ssh_config_path, max_parallel=5)
    connected.append(clients := connect_all([Host(h) for h in cluster.hosts], options, seen.append))
    assert list(clients) == cluster.hosts
    assert {run(client, "hostname") for client in clients.values()} == set(cluster.hosts)
    assert 1 <= peak <= 5
    assert [p.done for p in seen] == list(range(25)) and seen[-1] == Progress("connecting", 24, 24)


def test_retries_get_through_an_sshd_that_drops_most_handshakes(
    make_cluster: Callable[..., Cluster],
    tmp_path: Path,
    connected: list[dict[str, paramiko.SSHClient]],
) -> None:
    # Beyond 2 handshakes at once sshd drops 90% of new ones, beyond 4 all: a fixed window of 32 with
    # 3 retries each loses hosts; the window narrows to what sshd accepts instead.
    cluster = make_cluster(1, max_startups="2:90:4")
    aliases = {f"n{i}": cluster.addr("h1") for i in range(40)}
    config = write_config(tmp_path / "config", cluster, aliases)
    connected.append(clients := connect_all([Host(a) for a in aliases], SshOptions(config_file=config)))
    assert len(clients) == 40
    assert all(client.get_transport() is not None for client in clients.values())
