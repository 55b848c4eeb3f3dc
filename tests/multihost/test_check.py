"""`distrun check` on the simulated cluster: healthy, then one broken host at a time with its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, distrun_argv, read_terminal

pytestmark = pytest.mark.multihost


def check(cluster: Cluster, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        distrun_argv("check", *args),
        capture_output=True,
        text=True,
        env=cluster.env(PYTHONPATH=str(REPO)),
        cwd=cwd,
        timeout=300,
    )


def rows(result: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["host", "ssh", "login"]
    return {
        line.split()[0]: line.split()
        for line in lines[1:]
        if line.split() and line.split()[0].startswith("h")
    }


def test_healthy_cluster(cluster: Cluster) -> None:
    result = check(cluster, "-H", "h1:2,h2:1,h3:1")
    assert result.returncode == 0, result.stdout + result.stderr
    found = rows(result)
    assert sorted(found) == ["h1", "h2", "h3"]
    for host, cells in found.items():
        assert cells[1] == "ok" and cells[3] == host, cells  # status, hostname
        assert cells[-1] == ("-" if host == "h1" else "ok"), "TCP from every other host to rank 0's"
        assert cells[-2] == ("-" if host == "h1" else "eth0"), "the interface that routes to rank 0's host"
    assert result.stdout.splitlines()[-1] == "ready: all 3 hosts passed"
    assert result.stderr == "", "a pipe gets no progress line"


def test_sshd_down(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(2)
    cluster.stop_sshd("h2")
    result = check(cluster, "-H", "h1,h2")
    assert result.returncode == 3
    assert rows(result)["h2"][1] == "FAIL"
    assert rows(result)["h1"][1] == "ok", "one host down does not hide the others"
    assert "h2: problem: h2: connection refused by" in result.stdout
    assert "fix: check that h2 is up and sshd listens there (ssh h2 true)" in result.stdout
    assert result.stdout.splitlines()[-1] == "NOT READY: 1 of 2 hosts have problems (h2)"


def test_launch_directory_missing_on_one_host(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(2)
    job = tmp_path / "job"
    job.mkdir()
    cluster.hide_path("h2", tmp_path)
    result = check(cluster, "-H", "h1,h2", cwd=job)
    assert result.returncode == 3
    assert "missing" in rows(result)["h2"] and "missing" not in rows(result)["h1"]
    assert (
        f"h2: problem: launch directory {job} is missing; fix: create or mount {job} on h2" in result.stdout
    )
    assert "h1: problem" not in result.stdout


def test_tcp_to_rank_zero_blocked(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    cluster.block_tcp("h3", cluster.addr("h1"))
    result = check(cluster, "-H", "h1,h2,h3")
    assert result.returncode == 3
    assert (rows(result)["h2"][-1], rows(result)["h3"][-1]) == ("ok", "blocked")
    assert "h3: problem: cannot open a TCP connection to rank 0's host h1:" in result.stdout
    assert "check nftables/iptables" in result.stdout
    assert result.stdout.splitlines()[-1] == "NOT READY: 1 of 3 hosts have problems (h3)"


def test_key_refused_points_at_ssh_setup(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(1)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Host h1\n    HostName {cluster.addr('h1')}\n")
    for login in ("h1", "root@h1"):  # the fix names the login as given
        result = subprocess.run(
            distrun_argv("check", "-H", login),
            capture_output=True,
            text=True,
            env={**cluster.env(PYTHONPATH=str(REPO)), "HOME": str(home)},
            cwd=REPO,
            timeout=120,
        )
        assert result.returncode == 3
        assert f"fix: distrun ssh-setup -H {login}" in result.stdout


def test_missing_interpreter_is_not_blamed_on_ssh(cluster: Cluster) -> None:
    result = check(cluster, "-H", "h1", "--python", "/nonexistent/python")
    assert result.returncode == 3, result.stdout + result.stderr
    problem = next(line for line in result.stdout.splitlines() if line.startswith("h1: problem:"))
    assert "no Python interpreter found here (tried /nonexistent/python)" in problem
    assert problem.endswith("fix: give --python the path of a Python 3.7 or newer on h1"), problem


def test_terminal_gets_progress_and_colours(cluster: Cluster) -> None:
    import pty

    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(REPO)
        os.execvpe(sys.executable, distrun_argv("check", "-H", "h1,h2"), cluster.env(PYTHONPATH=str(REPO)))
    output = read_terminal(fd)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "checking 0/2 hosts" in text and "checking 2/2 hosts" in text
    assert "\x1b[32m" in text, "rows of healthy hosts are green on a terminal"


def test_one_host_under_a_name_and_an_address_is_a_problem(cluster: Cluster) -> None:
    result = check(cluster, "-H", f"h1:1,{cluster.addr('h1')}:1")
    assert result.returncode == 3, result.stdout + result.stderr
    assert (
        f"{cluster.addr('h1')}: problem: the same machine as h1 (one machine-id, boot and hostname); "
        "fix: list it once with both entries' slots (h1:2)"
    ) in result.stdout.splitlines()
