"""A backend written only against `launcher.backends.api.Backend`: its "hosts" are agents on this machine,
started
the way a remote host starts one (the bootstrap, the agent's sources on stdin), reached over their pipes.

tests/integration/test_backend_plugin.py registers it and launches a job through it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launcher.backends.api import Backend
from launcher.backends.bootstrap import bootstrap_args, shipped_sources
from launcher.backends.link import Link
from launcher.backends.local import ProcessLink
from launcher.console.progress import ProgressFn
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host

# Every host this backend opened, in order: the test checks the launch went through it.
OPENED: list[str] = []


class FakeBackend(Backend):
    name = "fake"
    takes_allocation = False
    one_machine_per_host = False  # every "host" is this machine, on purpose

    def open(
        self, hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None
    ) -> dict[str, Link]:
        sources = shipped_sources()
        links: dict[str, Link] = {}
        for host in hosts:
            link = ProcessLink(host.name, [sys.executable, *bootstrap_args(sources)])
            link.peer_addr = "127.0.0.1"  # rank 0's "host" is reached here
            for source in sources:
                link.send(source)
            links[host.name] = link
            OPENED.append(host.name)
        return links


BACKEND = FakeBackend()
