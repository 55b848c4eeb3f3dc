"""A backend written only against `launcher.backends.api.Backend`, in one file: its "hosts" are agents on this
machine, started the way a remote host starts one (the bootstrap, the agent's sources on stdin), reached over
their pipes. It brings its own option (`--fake-log FILE`: each host it opens is appended there) and its own
host source (`FAKE_HOSTS=a:2,b:1` when neither -H nor --hostfile is given).

tests/integration/test_backend_plugin.py registers it (in the table, and as a `distrun.backends` entry point
of an installed package) and launches jobs through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.backends.api import Backend, FoundHosts
from launcher.backends.bootstrap import bootstrap_args, shipped_sources
from launcher.backends.link import Link
from launcher.backends.local import ProcessLink
from launcher.backends.options import BackendOption
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host, parse_host_list
from launcher.core.progress import ProgressFn
from launcher.errors import UsageError

HOSTS_VAR = "FAKE_HOSTS"
# Every host this backend opened, in order: the test checks the launch went through it.
OPENED: list[str] = []


@dataclass(frozen=True)
class FakeOptions:
    log: Path | None = None


class FakeBackend(Backend):
    name = "fake"
    options = (BackendOption("fake-log", "Append each host the fake backend opens to FILE.", metavar="FILE"),)
    borrows_hosts = False
    one_machine_per_host = False  # every "host" is this machine, on purpose

    def parse_options(self, values: Mapping[str, Any], label: Callable[[str], str]) -> FakeOptions:
        log = values["fake_log"]
        if log is None:
            return FakeOptions()
        path = Path(log).expanduser()
        if not path.parent.is_dir():
            raise UsageError(f"{label('fake_log')} {log}: {path.parent} is not a directory")
        return FakeOptions(path)

    def find_hosts(self, environ: Mapping[str, str], options: object) -> FoundHosts | None:
        listed = environ.get(HOSTS_VAR)
        return FoundHosts(parse_host_list(listed, HOSTS_VAR)) if listed else None

    def open(
        self, hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None
    ) -> dict[str, Link]:
        options = config.backend_options.get(self.name, FakeOptions())
        assert isinstance(options, FakeOptions)
        sources = shipped_sources()
        links: dict[str, Link] = {}
        for host in hosts:
            link = ProcessLink(host.name, [sys.executable, *bootstrap_args(sources)])
            link.peer_addr = "127.0.0.1"  # rank 0's "host" is reached here
            for source in sources:
                link.send(source)
            links[host.name] = link
            OPENED.append(host.name)
            if options.log is not None:
                with options.log.open("a") as log:
                    log.write(host.name + "\n")
        return links


BACKEND = FakeBackend()
