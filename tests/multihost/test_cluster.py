"""The simulated cluster behaves like separate machines, checked with real OpenSSH clients."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.multihost.cluster import ETC_HOSTS, ETC_NETNS, STATE_DIR, Cluster
from tests.support import wait_until

pytestmark = pytest.mark.multihost

# A tiny client run inside a host: connect to (host, port) and print what happened.
PROBE = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print("ok", s.recv(64).decode(errors="replace").strip())
except OSError as e:
    print("fail", type(e).__name__, e)
"""


def probe(cluster: Cluster, host: str, target: str, port: int, timeout: float = 2.0) -> str:
    result = cluster.run(host, [sys.executable, "-c", PROBE, target, str(port), str(timeout)], check=True)
    return result.stdout.strip()


def ssh(cluster: Cluster, host: str, command: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cluster.ssh_argv(host, command), capture_output=True, text=True, timeout=timeout)


def test_each_host_has_its_own_hostname_over_ssh(cluster: Cluster) -> None:
    for host in cluster.hosts:
        result = ssh(cluster, host, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host
    assert socket.gethostname() not in cluster.hosts  # the launch machine keeps its own name


def test_run_executes_inside_the_host(cluster: Cluster) -> None:
    assert cluster.run("h3", ["hostname"], check=True).stdout.strip() == "h3"
    route = cluster.run("h3", ["ip", "-4", "-o", "addr", "show", "dev", "eth0"], check=True).stdout
    assert f"{cluster.addr('h3')}/24" in route


def test_hosts_resolve_and_reach_each_other_by_name(cluster: Cluster) -> None:
    resolved = cluster.run("h1", ["getent", "hosts", "h2"], check=True).stdout.split()
    assert resolved[0] == cluster.addr("h2")
    assert probe(cluster, "h1", "h2", 22).startswith("ok SSH-2.0")
    # The launch machine is on the test network under the name `launcher`, as a real launch host would be.
    assert (
        cluster.run("h2", ["getent", "hosts", "launcher"], check=True).stdout.split()[0]
        == cluster.bridge_addr
    )


def test_no_dns_inside_hosts(cluster: Cluster) -> None:
    started = time.monotonic()
    result = cluster.run("h1", ["getent", "hosts", "no-such-host.example"])
    assert result.returncode != 0
    assert time.monotonic() - started < 5  # fails at once instead of waiting on a nameserver


def test_root_loopback_is_not_reachable_from_a_host(cluster: Cluster) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # reachable from the root namespace itself
        assert probe(cluster, "h1", "127.0.0.1", port).startswith("fail ConnectionRefusedError")


def test_link_down_makes_a_host_unreachable(cluster: Cluster) -> None:
    cluster.link_down("h2")
    try:
        assert probe(cluster, "h1", "h2", 22, timeout=1.0).startswith("fail")
        with pytest.raises(OSError):
            socket.create_connection((cluster.addr("h2"), 22), timeout=1.0).close()
    finally:
        cluster.link_up("h2")
    wait_until(lambda: probe(cluster, "h1", "h2", 22).startswith("ok"), 10, "h2's sshd reachable again")
    assert ssh(cluster, "h2", "hostname").stdout.strip() == "h2"


def sleeps_on(cluster: Cluster, host: str) -> list[psutil.Process]:
    found = []
    for proc in cluster.processes(host):
        with contextlib.suppress(psutil.NoSuchProcess):  # sshd's short-lived children come and go
            if proc.name() == "sleep":
                found.append(proc)
    return found


def test_processes_lists_what_runs_on_a_host(cluster: Cluster) -> None:
    assert cluster.processes("h3") == []
    client = subprocess.Popen(cluster.ssh_argv("h3", "exec sleep 60"), stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: sleeps_on(cluster, "h3"), 10, "the sleep on h3")
        assert not sleeps_on(cluster, "h1")
        client.kill()
        client.wait()
        # Without a pty, a remote command outlives its ssh client: the orphan that distrun's agent prevents.
        assert sleeps_on(cluster, "h3")
    finally:
        client.kill()
        client.wait()

        def none_left() -> bool:
            # Rescanned until none is left: under load a scan can catch the session mid-exec and miss one.
            orphans = sleeps_on(cluster, "h3")
            for proc in orphans:
                proc.kill()
            return not orphans

        with contextlib.suppress(AssertionError):  # wait_clean() below says what is left
            wait_until(none_left, 10, "no sleep left on h3")
    assert cluster.wait_clean() == {}


def test_stopped_sshd_refuses_connections(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(1)
    cluster.stop_sshd("h1")
    result = ssh(cluster, "h1", "true")
    assert result.returncode == 255
    assert "Connection refused" in result.stderr
    cluster.start_sshd("h1")
    assert ssh(cluster, "h1", "hostname").stdout.strip() == "h1"


def test_rotated_host_key_is_refused_by_strict_checking(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(1)
    old_key = cluster.host_key("h1")
    cluster.rotate_host_key("h1")
    assert cluster.host_key("h1") != old_key
    result = ssh(cluster, "h1", "true")
    assert result.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
    assert cluster.run("h1", ["hostname"], check=True).stdout.strip() == "h1"  # restarted sshd kept its name


def test_home_dot_ssh_reaches_hosts_without_options(cluster: Cluster) -> None:
    config = (cluster.home / ".ssh" / "config").read_text()
    assert str(cluster.home / ".ssh" / "known_hosts") in config
    # OpenSSH takes ~ from the password database, so point -F at the HOME copy to check it is complete.
    result = subprocess.run(
        ["ssh", "-F", str(cluster.home / ".ssh" / "config"), "h1", "hostname"],
        capture_output=True,
        text=True,
        timeout=20,
        env=cluster.env(),
    )
    assert result.stdout.strip() == "h1", result.stderr
    assert "SSH_AUTH_SOCK" not in cluster.env()


def test_launcher_view_resolves_hosts_without_dns(cluster: Cluster) -> None:
    resolved = subprocess.run(
        cluster.launcher_argv(["getent", "hosts", "h2"]), capture_output=True, text=True, check=True
    )
    assert resolved.stdout.split() == [cluster.addr("h2"), "h2"]
    # Anything that is not a test host fails at once: the view has no nameserver and nsswitch says files only.
    unknown = subprocess.run(cluster.launcher_argv(["getent", "hosts", "no-such-host"]), capture_output=True)
    assert unknown.returncode == 2
    assert "h2" not in ETC_HOSTS.read_text().split()  # the machine's own view is untouched


def test_etc_hosts_lines_are_added_and_removed(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(1, etc_hosts=True)
    marker = f"# distrun-cluster {cluster.id}"
    ours = [line for line in ETC_HOSTS.read_text().splitlines() if line.endswith(marker)]
    assert ours == [f"{cluster.addr('h1')}\th1\t{marker}"]
    cluster.close()
    # Only our own lines went: other clusters may be adding and removing theirs at the same time.
    assert not [line for line in ETC_HOSTS.read_text().splitlines() if marker in line]
    assert "localhost" in ETC_HOSTS.read_text()


def test_close_removes_everything() -> None:
    cluster = Cluster(3)
    netns = [cluster.netns(h) for h in cluster.hosts]
    sshd_pids = [cluster.sshd_pid(h) for h in cluster.hosts]
    subprocess.run(cluster.ssh_argv("h1", "true"), check=True, timeout=20)
    state_file = STATE_DIR / f"{cluster.id}.json"
    links = json.loads(state_file.read_text())["veths"] + [f"drbr{cluster.id}"]
    assert all(Path("/sys/class/net", link).exists() for link in links)

    cluster.close()
    cluster.close()  # idempotent

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(ns in listed for ns in netns)
    assert not any(Path("/sys/class/net", link).exists() for link in links)
    assert not any(psutil.pid_exists(pid) for pid in sshd_pids if pid is not None)
    assert not any((ETC_NETNS / ns).exists() for ns in netns)
    assert not cluster.workdir.exists()
    assert not state_file.exists()
    rules = subprocess.run(["ip", "rule", "list"], capture_output=True, text=True, check=True).stdout
    assert f"lookup {21300 + cluster.subnet}" not in rules


def test_failed_set_up_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Cluster] = []

    def broken(self: Cluster, names: object) -> None:
        seen.append(self)
        raise RuntimeError("sshd never came up")

    monkeypatch.setattr(Cluster, "_wait_ready", broken)
    with pytest.raises(RuntimeError, match="sshd never came up"):
        Cluster(2)
    (half_built,) = seen
    assert not [link for link in os.listdir("/sys/class/net") if half_built.id in link]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert half_built.id not in listed
    sshds = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(half_built.workdir) in " ".join(p.info["cmdline"] or [])
    ]
    assert sshds == []
    assert not (STATE_DIR / f"{half_built.id}.json").exists()
    assert not half_built.workdir.exists()
