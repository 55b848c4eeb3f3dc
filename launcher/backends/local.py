"""Run a host's agent as a child process of the launcher, talking over pipes; the `local` backend."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.agent.protocol import ORPHAN_GRACE_CAP, READ_SIZE, write_all
from launcher.backends.api import Backend
from launcher.backends.bootstrap import local_argv
from launcher.backends.forked import ForkedAgent, fork_safe
from launcher.backends.link import Link, abort, opening
from launcher.backends.locality import refuse_this_machine_twice
from launcher.core.hosts import Host
from launcher.errors import UsageError

if TYPE_CHECKING:
    from launcher.core.config import LaunchConfig

LAST_WORDS_WAIT = 2.0


class ProcessLink:
    """An agent behind a child process of ours (the agent itself, or `srun` running it), over its pipes."""

    heartbeat = False
    peer_addr: str | None = None
    local_addr: str | None = None
    # How long the process may take to end after EOF: the agent may still be stopping its ranks.
    close_wait = ORPHAN_GRACE_CAP + 1.0

    def __init__(self, host: str, argv: Sequence[str]) -> None:
        # Own session: the terminal's Ctrl-C reaches only distrun, which then stops the job in order.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._attach(host, proc)

    def _attach(self, host: str, proc: subprocess.Popen[bytes] | ForkedAgent) -> None:
        self.host = host
        self._proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self._in = proc.stdin.fileno()
        self._out = proc.stdout.fileno()

    def fileno(self) -> int:
        return self._out

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # the agent is gone; recv() reports it
            write_all(self._in, data)

    def recv(self) -> bytes:
        try:
            return os.read(self._out, READ_SIZE)
        except OSError:
            return b""

    def diagnostics(self) -> str:
        err = self._proc.stderr
        if err is None:
            return ""
        # Asked once our end of the pipe saw EOF: the process is ending, and srun reports a failed step a
        # moment after its task is gone. Reading stderr before it exits could block.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=LAST_WORDS_WAIT)
        if self._proc.poll() is None:
            return ""
        return err.read().decode(errors="replace").strip()

    def close_input(self) -> None:
        """The agent sees EOF on stdin: it stops what still runs and exits."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def close(self) -> None:
        self.close_input()
        # After EOF the agent may still be stopping its ranks (SIGTERM, then SIGKILL): let it finish.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=self.close_wait)
        if self._proc.poll() is None:
            self.abort()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def abort(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class LocalLink(ProcessLink):
    """The agent for a host that is this machine: no SSH, the same protocol over pipes."""

    def __init__(self, host: str, python: str = sys.executable) -> None:
        if python == sys.executable and fork_safe():
            self._attach(host, ForkedAgent())
        else:
            super().__init__(host, local_argv(python))


class LocalTransport:
    """Hosts that are this machine: one agent process each, started with this interpreter."""

    def open(self, hosts: Sequence[Host]) -> dict[str, Link]:
        # One at a time, on this thread: the first agent may be a fork, safe only while no other thread runs.
        with opening(abort) as links:
            for host in hosts:
                links[host.name] = LocalLink(host.name)
        return links


class LocalBackend(Backend):
    """`--launcher local`: every rank on this machine, whatever the environment says (no allocation)."""

    name = "local"
    borrows_hosts = False

    def check_options(self, hosts: Sequence[Host] | None, environ: Mapping[str, str]) -> None:
        if hosts is not None:
            raise UsageError("--launcher local runs every rank on this machine: drop -H/--hostfile")

    def local_by_name(self, hosts: Sequence[Host]) -> list[bool]:
        return [True] * len(hosts)

    def local_hosts(self, hosts: Sequence[Host], config: LaunchConfig) -> list[bool]:
        local = [True] * len(hosts)
        refuse_this_machine_twice(hosts, local)
        return local


BACKEND = LocalBackend()
