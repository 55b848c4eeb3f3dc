"""Connecting (launcher.backends.ssh.connect) without a server: usage errors, retries, classification,
limits."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from launcher.backends.ssh import connect as sshconn
from launcher.backends.ssh.config import SshTarget, resolve_target
from launcher.backends.ssh.connect import connect_all
from launcher.backends.ssh.options import SshOptions
from launcher.backends.window import Aborted, Window
from launcher.core.hosts import Host
from launcher.errors import HostError, UsageError


def test_missing_identity_file_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="identity file /nope/key does not exist"):
        connect_all([Host("h")], SshOptions(identity_files=(Path("/nope/key"),)))


def test_dns_failure_names_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    # No real lookup happens: the resolver is replaced, so no DNS traffic leaves the machine.
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(HostError, match=r"^nowhere: cannot resolve host name 'nowhere'") as info:
        connect_all([Host("nowhere")], SshOptions(config_file=_empty_config(tmp_path)))
    assert info.value.exit_code == 3


def _empty_config(directory: Path) -> Path:
    path = directory / "empty_config"
    path.write_text("")
    return path


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


def test_retries_give_up_at_once_when_another_host_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    window = Window(4)

    def dropped(target: SshTarget, options: SshOptions, via: Any, password: str | None = None) -> Any:
        window.abort()  # another host fails while this one is in its handshake
        raise sshconn._Transient("SSH handshake with h:22 failed: Error reading SSH protocol banner")

    monkeypatch.setattr(sshconn, "_connect_once", dropped)
    target = resolve_target(Host("h"), SshOptions(), None)
    with pytest.raises(Aborted):
        sshconn.connect_target(target, SshOptions(retries=5), window=window)
    assert window.size == 2  # the drop also narrowed the window
