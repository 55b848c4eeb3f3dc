"""Backends: how a job's agents are started and reached (this machine, SSH, srun, ...), as plug-ins.

A backend is one module holding a `BACKEND` object, found by name: in the `BACKENDS` table (this
repository's), else through a `distrun.backends` entry point of an installed package (looked up only for a
name the table lacks, so a launch never pays for scanning installed packages). `--launcher`, the launch
(`launcher.runtime.node.connect`) and `distrun check` use only the `Backend` interface below. A backend brings
its own options (`options`, `parse_options`) and may know where its hosts come from (`find_hosts`).

To add one: subclass `Backend` in a new module, set `BACKEND = YourBackend()` there, and add its name and
module to `BACKENDS` (and to `NOTES` what --launcher's help should say of it beyond its name), or declare
`[project.entry-points."distrun.backends"] NAME = "pkg.module"` in your package (tests register theirs with
`register`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.backends.options import BackendOption
from launcher.core.hosts import Host
from launcher.core.progress import ProgressFn
from launcher.errors import HostError, UsageError

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
# What --launcher's help says of a backend after its name, where a name alone would not do. Those noted come
# first, in this order: the default inside an allocation before the default elsewhere.
NOTES: dict[str, str] = {
    "srun": "[default inside a Slurm allocation]",
    "ssh": "(local names run here)",
}
ENTRY_POINTS = "distrun.backends"
# Backends already found, by name and module: each is looked up once per process, wherever it is asked for.
_FOUND: dict[tuple[str, str], Backend] = {}


@dataclass(frozen=True)
class FoundHosts:
    """Hosts a backend found in the environment (a Slurm allocation), and how many ranks it asks for."""

    hosts: tuple[Host, ...]
    num_proc: int | None = None


@dataclass(frozen=True)
class Liveness:
    """How a backend's links are watched: a heartbeat every `interval` seconds, and a host silent for
    `count` beats (`dead_after`) is lost."""

    interval: float
    count: int

    @property
    def dead_after(self) -> float:
        return self.interval * self.count


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
    # Its own command-line options; their validated value (`parse_options`) is
    # `config.backend_options[name]`.
    options: tuple[BackendOption, ...] = ()
    # Without -H/--hostfile and hosts of its own (`find_hosts`), it runs on the hosts another backend finds
    # in the environment (ssh to the nodes of a Slurm allocation).
    borrows_hosts = True
    # Each host is a machine of its own: two whose agents report one machine (a name and an address of one
    # host) are refused. Only a backend that puts several "hosts" on one machine on purpose says False.
    one_machine_per_host = True

    def check_options(self, hosts: Sequence[Host] | None, environ: Mapping[str, str]) -> None:
        """UsageError when this backend cannot run what the command line asked for (checked at parse time)."""

    def parse_options(self, values: Mapping[str, Any], label: Callable[[str], str]) -> object:
        """The validated value of this backend's `options` (`values` by `BackendOption.key`); UsageError names
        the option as `label(key)` does (the flag, or the config file's line it came from)."""
        return dict(values)

    def find_hosts(self, environ: Mapping[str, str], options: object) -> FoundHosts | None:
        """Where hosts come from when none are given (-H, --hostfile): a backend that finds some is the
        default `--launcher` there, as srun is inside a Slurm allocation. None: this backend knows of none."""
        return None

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

    def liveness(self, config: LaunchConfig) -> Liveness:
        """The heartbeat pace of this backend's links. By default `--ssh-keepalive` and
        `--ssh-keepalive-count`: the ssh backend declares them, and every backend's links obey them."""
        from launcher.backends.ssh.options import ssh_options

        options = ssh_options(config)
        return Liveness(options.keepalive_interval, options.keepalive_count)

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


def launcher_help() -> str:
    """--launcher's help: every backend of the table, each with its note."""
    noted = [f"{name} {note}" for name, note in NOTES.items() if name in BACKENDS]
    plain = [name for name in BACKENDS if name not in NOTES]
    return f"How agents start: {', '.join([*noted, *plain])}."


def table() -> tuple[Backend, ...]:
    """This repository's backends (and those registered), in `--launcher`'s order."""
    return tuple(get(name) for name in BACKENDS)


def get(name: str) -> Backend:
    """The backend called `name`: from the table, else from an installed package's `distrun.backends` entry
    point (which then joins the table). KeyError for a name neither knows; UsageError for one that does not
    load."""
    module = BACKENDS.get(name) or _entry_point(name)
    found = _FOUND.get((name, module))
    if found is not None:
        return found
    try:
        backend = importlib.import_module(module).BACKEND
    except (ImportError, AttributeError) as err:
        raise UsageError(f"--launcher {name}: cannot load its backend {module}: {err}") from None
    if not isinstance(backend, Backend):
        raise UsageError(f"--launcher {name}: {module}.BACKEND is not a launcher.backends.api.Backend")
    _FOUND[name, module] = backend
    return backend


def _entry_point(name: str) -> str:
    from importlib.metadata import entry_points  # only for a name the table lacks: scanning costs start-up

    for point in entry_points(group=ENTRY_POINTS, name=name):
        register(name, point.module)
        return point.module
    raise KeyError(name)


def register(name: str, module: str) -> None:
    """Add a backend by name (tests; installed packages use the `distrun.backends` entry point instead)."""
    BACKENDS[name] = module
