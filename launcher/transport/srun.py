"""Inside a Slurm allocation: each host's agent is the one task of an `srun` step on that node.

srun's stdin/stdout carry the agent's frames exactly as an SSH channel does (`launcher.slurm.srun_argv` has
the options that make that hold), so nodes need no SSH between them, and EOF, heartbeats and STOP work as on
SSH hosts: if distrun dies, even by SIGKILL, each srun loses its stdin and the agent stops its ranks.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.backend import Backend
from launcher.errors import HostError, UsageError
from launcher.hosts import Host
from launcher.progress import ProgressFn
from launcher.protocol import ORPHAN_GRACE_CAP, write_all
from launcher.slurm import JOB_ID, srun_argv
from launcher.transport.bootstrap import agent_pythons, remote_command, shipped_sources
from launcher.transport.link import Link
from launcher.transport.local import ProcessLink

if TYPE_CHECKING:
    from launcher.config import LaunchConfig

# srun's lines that say nothing the agent has not said better: "srun: error: node01: task 0: Exited with exit
# code 127", and the notice that a cluster without task/affinity ignores --cpu-bind.
_SRUN_NOISE = re.compile(r"srun: (error: \S+: tasks? [0-9,-]+: |.*lacks support for cpu binding)")
# srun turns SIGTERM into SIGKILL for every task of its step: how long to let it cancel the step.
CANCEL_WAIT = 5.0


class SrunLink(ProcessLink):
    """`srun` running the shipped agent on one node; the node is reached by its Slurm name."""

    # Between us and the agent are srun, slurmd and the network: it can go silent without closing.
    heartbeat = True
    # After the agent exits, srun still waits for slurmstepd to report the step complete.
    close_wait = ORPHAN_GRACE_CAP + CANCEL_WAIT

    def __init__(self, host: str, pythons: Sequence[str], sources: Sequence[bytes]) -> None:
        # Only our own constant bootstrap goes through the node's shell; user data travels in frames.
        super().__init__(host, srun_argv(host, ["/bin/sh", "-c", remote_command(pythons, sources)]))
        # Slurm's nodes resolve each other by these names, so rank 0's is a MASTER_ADDR every node can use.
        self.peer_addr = host
        try:
            for source in sources:
                write_all(self._in, source)
        except OSError:
            pass  # srun already exited: the closed link and its stderr say why

    def diagnostics(self) -> str:
        """The agent's last words, without srun's restatement of the task's end after them."""
        said = super().diagnostics().splitlines()
        return "\n".join(line for line in said if not _SRUN_NOISE.match(line))

    def abort(self) -> None:
        """Cancel the step: srun answers SIGTERM by killing every task of it, wherever it runs."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(CANCEL_WAIT)
            except subprocess.TimeoutExpired:
                super().abort()


class SrunTransport:
    """Every host of the job through `srun` steps of the current allocation (`SLURM_JOB_ID` in our env)."""

    def __init__(self, pythons: Sequence[str]) -> None:
        self._pythons = list(pythons)

    def open(self, hosts: Sequence[Host]) -> dict[str, Link]:
        sources = shipped_sources()
        links: dict[str, SrunLink] = {}
        try:
            for host in hosts:
                try:
                    links[host.name] = SrunLink(host.name, self._pythons, sources)
                except OSError as err:
                    raise HostError(
                        f"host {host.name}: cannot run srun: {err.strerror or err}", host=host.name
                    ) from None
        except BaseException:
            for link in links.values():
                link.abort()
            raise
        return dict(links)


class SrunBackend(Backend):
    """`--launcher srun` (the default inside an allocation): every host, this machine included, gets an srun
    step; Slurm's names need no lookups here, and are what rank 0's host is reached by."""

    name = "srun"

    def check_options(self, hosts: Sequence[Host] | None, environ: Mapping[str, str]) -> None:
        if not environ.get(JOB_ID):
            raise UsageError(
                f"--launcher srun needs a Slurm allocation (salloc, sbatch): {JOB_ID} is not set"
            )

    def open(
        self, hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None
    ) -> dict[str, Link]:
        return SrunTransport(agent_pythons(config.python)).open(hosts)


BACKEND = SrunBackend()
