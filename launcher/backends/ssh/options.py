"""The ssh backend's own options: what the command line declares (`SSH_OPTIONS`) and the value they make
(`SshOptions`, `config.backend_options["ssh"]`). No paramiko here: the CLI reads this at every start."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from launcher.backends.options import BackendOption
from launcher.errors import UsageError

if TYPE_CHECKING:
    from launcher.core.config import LaunchConfig

HostKeyPolicy = Literal["strict", "accept-new", "ignore"]
PORT_RANGE = (1, 65535)


@dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts. None means: what ~/.ssh/config says, else the default.

    The keepalive also paces every backend's heartbeats (launcher.job.run): a host silent for
    keepalive_interval x keepalive_count is lost, whatever carries its agent.
    """

    port: int | None = None
    identity_files: tuple[Path, ...] = ()
    host_key_policy: HostKeyPolicy | None = None
    connect_timeout: float = 10.0
    keepalive_interval: float = 2.0
    keepalive_count: int = 5
    max_parallel: int = 32
    retries: int = 3
    config_file: Path | None = None
    known_hosts_file: Path | None = None


SSH_OPTIONS = (
    BackendOption(
        "ssh-port",
        "SSH port [default: ~/.ssh/config, else 22].",
        int,
        minimum=PORT_RANGE[0],
        maximum=PORT_RANGE[1],
    ),
    BackendOption(
        "ssh-identity-file",
        "SSH private key (repeatable).",
        Path,
        multiple=True,
        short="-i",
        must_exist=True,
    ),
    BackendOption("host-key-policy", "Unknown host keys.", choices=("strict", "accept-new", "ignore")),
    BackendOption("ssh-connect-timeout", "", float, 10.0, "SECONDS", show_default=True),
    BackendOption(
        "ssh-keepalive",
        "Probe interval; a host is dead after --ssh-keepalive-count missed probes.",
        float,
        2.0,
        "SECONDS",
        show_default=True,
    ),
    BackendOption(
        "ssh-keepalive-count",
        "Missed probes after which a silent host is lost.",
        int,
        5,
        "N",
        minimum=1,
        show_default=True,
    ),
)


def ssh_options(config: LaunchConfig) -> SshOptions:
    """The launch's SSH settings (its defaults where the CLI parsed none, as in a test's config)."""
    options = config.backend_options.get("ssh")
    return options if isinstance(options, SshOptions) else SshOptions()


def seconds(value: float, option: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be a positive number of seconds, got {value:g}")
    return value


def parse_ssh_options(values: Mapping[str, Any], label: Callable[[str], str]) -> SshOptions:
    return SshOptions(
        port=values["ssh_port"],
        identity_files=tuple(Path(p).expanduser() for p in values["ssh_identity_file"]),
        host_key_policy=cast("HostKeyPolicy | None", values["host_key_policy"]),
        connect_timeout=seconds(values["ssh_connect_timeout"], label("ssh_connect_timeout")),
        keepalive_interval=seconds(values["ssh_keepalive"], label("ssh_keepalive")),
        keepalive_count=values["ssh_keepalive_count"],
    )
