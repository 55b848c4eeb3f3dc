"""Backends: how a job's agents are started and reached (this machine, SSH, srun, ...), as plug-ins.

A backend is one module holding a `BACKEND` object, and one entry in `BACKENDS`: `--launcher`, the launch
(`launcher.job.node.connect`) and `distrun check` find it by name and use only the `Backend` interface below.
Modules are imported on first use, so a launch on this machine never imports paramiko.

To add one: subclass `Backend` in a new module, set `BACKEND = YourBackend()` there, and add its name and
module to `BACKENDS` (tests register theirs with `register`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.console.progress import ProgressFn
from launcher.core.hosts import Host
from launcher.errors import HostError

if TYPE_CHECKING:
    from launcher.backends.link import Link
    from launcher.core.config import LaunchConfig

# name -> the module holding its BACKEND; the order is --launcher's.
BACKENDS: dict[str, str] = {
    "ssh": "launcher.backends.ssh.backend",
    "srun": "launcher.backends.slurm.backend",
    "local": "launcher.backends.local",
}
DEFAULT = "ssh"


@dataclass(frozen=True)
class CheckedLink:
    """What `distrun check` learnt reaching one host: a link, or the error that says why there is none.

    `login_s`: how long reaching it took; `host_key`: known, recorded (accept-new), unchecked (ignore),
    local, or the backend's name where it has no host keys; `error_kind`: see
    `launcher.check.verdict.HostCheck`.
    """

    link: Link | None
    login_s: float | None = None
    host_key: str | None = None
    error: str | None = None
    error_kind: str | None = None


class Backend:
    """Starts agents on hosts and says how to reach them. Subclasses override what differs."""

    name = ""
    # The hosts may come from the environment (a Slurm allocation) when none are given.
    takes_allocation = True
    # Each host is a machine of its own: two whose agents report one machine (a name and an address of one
    # host) are refused. Only a backend that puts several "hosts" on one machine on purpose says False.
    one_machine_per_host = True

    def check_options(self, hosts: Sequence[Host] | None, environ: Mapping[str, str]) -> None:
        """UsageError when this backend cannot run what the command line asked for (checked at parse time)."""

    def local_hosts(self, hosts: Sequence[Host], config: LaunchConfig) -> list[bool]:
        """Which hosts are this machine and run through a local agent (a pipe), not through `open`."""
        return [False] * len(hosts)

    def local_by_name(self, hosts: Sequence[Host]) -> list[bool]:
        """`local_hosts` as far as names alone tell, with no lookups (for --dry-run)."""
        return [False] * len(hosts)

    def open(
        self, hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None
    ) -> dict[str, Link]:
        """A link per host name, each with a running agent; all or nothing: on a failure every link already
        made is dropped and HostError names the failing host. `progress` hears how far it got."""
        raise NotImplementedError

    def open_for_check(self, host: Host, config: LaunchConfig) -> CheckedLink:
        """One host for `distrun check`: never raises for the host's own failure (every host gets its row)."""
        started = time.monotonic()
        try:
            link = self.open([host], config)[host.name]
        except HostError as err:
            return CheckedLink(None, error=str(err), error_kind="other")
        return CheckedLink(link, login_s=time.monotonic() - started, host_key=self.name)

    def master_address(
        self, given: str | None, local: Sequence[bool], links: Sequence[Link | None]
    ) -> str | None:
        """An address of rank 0's host that every host can reach (never loopback when any host is remote).

        `local[i]`/`links[i]`: whether host i (host 0 holds rank 0) is this machine, and its link (None where
        it could not be reached). None when proxies hide the address: only `--master-addr` can say it then.
        """
        if given:
            return given
        if all(local):
            return "127.0.0.1"
        if not local[0]:
            return links[0].peer_addr if links[0] is not None else None
        # Rank 0 runs here: this machine's address as the remote hosts see it.
        return next(
            (
                link.local_addr
                for link, is_local in zip(links, local, strict=True)
                if link is not None and not is_local and link.local_addr
            ),
            None,
        )


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def get(name: str) -> Backend:
    """The backend called `name` (its module imported now); KeyError for a name not in the table."""
    backend = importlib.import_module(BACKENDS[name]).BACKEND
    assert isinstance(backend, Backend), f"{BACKENDS[name]}.BACKEND is not a Backend"
    return backend


def register(name: str, module: str) -> None:
    """Add a backend by name (tests, and plug-ins that cannot edit `BACKENDS`)."""
    BACKENDS[name] = module
