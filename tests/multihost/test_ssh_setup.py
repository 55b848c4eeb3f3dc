"""`distrun ssh-setup` against a real sshd that takes a password: key created, installed once, verified."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, clean_env, distrun_argv, read_terminal

pytestmark = pytest.mark.multihost

PASSWORD = "correct horse 42"
USER = "drsetup"


def fresh_home(tmp_path: Path, cluster: Cluster) -> Path:
    """A user who has never used SSH: no key, no known_hosts; ~/.ssh/config only names the hosts."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    blocks = [f"Host {h}\n    HostName {cluster.addr(h)}\n" for h in cluster.hosts]
    (home / ".ssh" / "config").write_text("".join(blocks))
    return home


def run_as(home: Path, *args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in clean_env(PYTHONPATH=str(REPO)).items() if k != "SSH_AUTH_SOCK"}
    env["HOME"] = str(home)
    return subprocess.run(
        distrun_argv(*args), input=stdin, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout
    )


def test_ssh_setup_installs_the_key_once_then_launches(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(2)
    user_home = cluster.add_password_user("h1", USER, PASSWORD)
    home = fresh_home(tmp_path, cluster)
    host = f"{USER}@h1"

    # Before: no key anywhere, so a launch is refused with the fix in the message.
    before = run_as(home, "-H", host, "true")
    assert before.returncode == 3, before.stderr
    assert "authentication refused" in before.stderr

    first = run_as(home, "ssh-setup", "-H", host, "--password-stdin", stdin=PASSWORD + "\n")
    assert first.returncode == 0, first.stderr
    assert f"created the key {home}/.ssh/id_ed25519" in first.stdout
    assert "h1: key installed; key login works" in first.stdout
    assert PASSWORD not in first.stdout + first.stderr
    key = home / ".ssh" / "id_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600
    public = (home / ".ssh" / "id_ed25519.pub").read_text().split()[1]
    authorized = user_home / ".ssh" / "authorized_keys"
    assert authorized.read_text().count(public) == 1
    assert authorized.stat().st_mode & 0o777 == 0o600
    assert (user_home / ".ssh").stat().st_mode & 0o777 == 0o700
    known = (home / ".ssh" / "known_hosts").read_text()
    assert cluster.host_key("h1").split()[1] in known, (
        "host key recorded (accept-new; Debian hashes the name)"
    )

    # The password is nowhere on disk: not in the launcher's home, not on the host.
    for path in [*home.rglob("*"), *user_home.rglob("*")]:
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path

    second = run_as(home, "ssh-setup", "-H", host, "--password-stdin", stdin="")
    assert second.returncode == 0, second.stderr
    assert "h1: key login works already" in second.stdout
    assert "created the key" not in second.stdout
    assert "(0 changed)" in second.stdout
    assert authorized.read_text().count(public) == 1, "a second run installs no duplicate"

    launch = run_as(home, "-H", host, "python", "-c", "import getpass, socket; print(socket.gethostname())")
    assert launch.returncode == 0, launch.stderr
    assert launch.stdout.strip() == "[0] h1"


def test_ssh_setup_obeys_strict_host_key_checking_in_ssh_config(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """`StrictHostKeyChecking yes` in ~/.ssh/config: ssh-setup learns no key, as a launch refuses the host
    (issue 31, item 6)."""
    cluster = make_cluster(2)
    user_home = cluster.add_password_user("h1", USER, PASSWORD)
    home = fresh_home(tmp_path, cluster)
    config = home / ".ssh" / "config"
    config.write_text(
        config.read_text().replace("\n    HostName", "\n    StrictHostKeyChecking yes\n    HostName")
    )
    host = f"{USER}@h1"

    launch = run_as(home, "-H", host, "true")
    assert launch.returncode == 3, launch.stderr
    assert "host key checking is strict" in launch.stderr

    setup = run_as(home, "ssh-setup", "-H", host, "--password-stdin", stdin=PASSWORD + "\n")
    assert setup.returncode == 3, setup.stdout + setup.stderr
    assert "host key checking is strict" in setup.stderr
    assert "Permanently added" not in setup.stdout + setup.stderr
    assert not (home / ".ssh" / "known_hosts").exists()
    assert not (user_home / ".ssh" / "authorized_keys").exists(), "nothing sent to a host not verified"


def test_ssh_setup_wrong_password_and_host_without_password_logins(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(2)
    cluster.add_password_user("h1", USER, PASSWORD)
    home = fresh_home(tmp_path, cluster)
    result = run_as(home, "ssh-setup", "-H", f"{USER}@h1,h2", "--password-stdin", stdin="Wr0ngPassw0rd\n")
    assert result.returncode == 3
    assert f"h1: password refused for user {USER}" in result.stderr
    assert "h2: user root cannot log in with a password there (the host allows: publickey)" in result.stderr
    assert "ssh-setup failed on 2 hosts: h1, h2" in result.stderr
    assert "Wr0ngPassw0rd" not in result.stdout + result.stderr


def test_ssh_setup_needs_a_terminal_or_password_stdin(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(1)
    cluster.add_password_user("h1", USER, PASSWORD)
    home = fresh_home(tmp_path, cluster)
    result = subprocess.run(
        distrun_argv("ssh-setup", "-H", f"{USER}@h1"),
        capture_output=True,
        text=True,
        env={**clean_env(PYTHONPATH=str(REPO)), "HOME": str(home)},
        cwd=REPO,
        timeout=120,
        start_new_session=True,  # no controlling terminal: /dev/tty cannot be opened
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "no terminal to ask for the password on; pipe it with --password-stdin" in result.stderr
    assert os.path.exists(home / ".ssh" / "id_ed25519")


def test_ssh_setup_asks_once_on_the_terminal(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    """A real pseudo-terminal: one prompt for two hosts, and the typed password is not echoed."""
    cluster = make_cluster(2)
    for host in ("h1", "h2"):
        cluster.add_password_user(host, USER, PASSWORD)
    home = fresh_home(tmp_path, cluster)
    env = {**clean_env(PYTHONPATH=str(REPO)), "HOME": str(home)}
    pid, fd = pty.fork()
    if pid == 0:  # the child: distrun on the terminal
        os.chdir(REPO)
        os.execvpe(sys.executable, distrun_argv("ssh-setup", "-H", f"{USER}@h1,{USER}@h2"), env)
    output = b""
    try:
        while b"password for" not in output:
            output += os.read(fd, 4096)
        os.write(fd, PASSWORD.encode() + b"\n")
        output += read_terminal(fd)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert text.count("password for") == 1
    assert f"password for {USER}@h1, {USER}@h2: " in text
    assert PASSWORD not in text, "the terminal must not echo the password"
    assert "h1: key installed; key login works" in text and "h2: key installed; key login works" in text
