"""Inside a Slurm allocation: every host's agent in one `srun` step, each dialing home to distrun over TCP.

One step for the whole job is what a Slurm user would start by hand: one request to slurmctld, one launch that
slurmd fans out along its own tree, one srun client. Every task of the step reads the same bootstrap on its
stdin (the agent's sources, then the invitation: distrun's addresses, port and the job's secret) and connects
back (`launcher.agent.homing`, `launcher.backends.dialhome`). From then on each agent's connection is its
link,
with the same protocol and heartbeats as over SSH.

Nothing outlives distrun: its sockets close with it, even on SIGKILL, and each agent seeing EOF stops its
ranks and exits, which ends the step; an agent cut off silently stops them when the heartbeats stop. A node
lost mid-job is dropped alone (`--kill-on-bad-exit=0`); the others go on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.backends.api import Backend, FoundHosts
from launcher.backends.slurm.allocation import JOB_ID, allocation_from_env, srun_step_argv
from launcher.core.hosts import Host
from launcher.core.progress import ProgressFn
from launcher.errors import HostError, UsageError

if TYPE_CHECKING:
    from launcher.backends.dialhome import SocketLink
    from launcher.backends.link import Link
    from launcher.core.config import LaunchConfig

# srun's lines that say nothing the agent has not said better: "srun: error: node01: task 0: Exited with exit
# code 127", and the notice that a cluster without task/affinity ignores --cpu-bind.
_SRUN_NOISE = re.compile(r"srun: (error: \S+: tasks? [0-9,-]+: |.*lacks support for cpu binding)")
# How long the step may take to end once every agent has gone, and after srun is asked to cancel it.
STEP_END_WAIT = 5.0
# The wait for agents to dial in gives up when none has for this long (srun may queue the step meanwhile).
DIAL_STALL = 60.0


def _addresses(toward: str) -> list[str]:
    """This machine's addresses the agents may dial, best first: the one that routes to `toward` (a node),
    then every other that is not loopback or link-local, then loopback (a node may be this machine)."""
    import psutil

    best: list[str] = []
    with contextlib.suppress(OSError):
        for family, _, _, _, sockaddr in socket.getaddrinfo(toward, 9, type=socket.SOCK_DGRAM):
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                best.append(str(s.getsockname()[0]))
            break
    rest: list[str] = []
    loopback: list[str] = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(a.address.split("%")[0])
            if ip.is_link_local:
                continue
            (loopback if ip.is_loopback else rest).append(str(ip))
    return list(dict.fromkeys([*best, *rest, *loopback]))


class SrunStep:
    """The one `srun` process running every agent; links share it, and the last one closed ends it."""

    def __init__(self, names: Sequence[str], pythons: Sequence[str]) -> None:
        # Only a job that starts a step loads these: every launch's command line reads this module's options.
        import tempfile

        from launcher.agent.protocol import write_all
        from launcher.backends.bootstrap import HOMING, remote_command, shipped_sources
        from launcher.backends.dialhome import Home

        self.home = Home(names, _addresses(names[0]))
        sources = shipped_sources()
        command = ["/bin/sh", "-c", remote_command(pythons, sources, HOMING)]
        # A file, not a pipe: nobody need read srun's output while the job runs for srun never to block.
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - closed when the step ends
        self._proc = subprocess.Popen(
            srun_step_argv(names, command),
            stdin=subprocess.PIPE,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the terminal's Ctrl-C reaches only distrun
        )
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):  # srun already exited: gather() reports why
            for source in sources:
                write_all(self._proc.stdin.fileno(), source)
            write_all(self._proc.stdin.fileno(), self.home.invitation())
        # Every agent has its bootstrap: EOF tells srun there is no more to forward.
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        self.links: list[SocketLink] = []

    def ended(self) -> str | None:
        code = self._proc.poll()
        return None if code is None else f"srun exited with code {code}"

    def diagnostics(self) -> str:
        """The agents' and srun's last words (all nodes together), without srun's restatements."""
        self._output.seek(0)
        said = self._output.read().decode(errors="replace").splitlines()
        lines = [line for line in said if line.strip() and not _SRUN_NOISE.match(line)]
        return lines[-1] if lines else ""

    def gather(self, progress: ProgressFn | None) -> dict[str, SocketLink]:
        links = self.home.gather(DIAL_STALL, self.ended, self.diagnostics, progress)
        self.links = list(links.values())
        for link in self.links:
            link.on_closed = self._link_closed
        return links

    def _link_closed(self) -> None:
        if all(link.closed for link in self.links):
            self.end()

    def end(self) -> None:
        """Let the step finish (its agents are gone or going); else cancel it (srun answers SIGTERM by killing
        every task of the step, wherever it runs); else kill srun."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(STEP_END_WAIT)
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(STEP_END_WAIT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._output.close()


class SrunBackend(Backend):
    """`--launcher srun` (the default inside an allocation): every host, this machine included, gets its
    agent from the job's one srun step; Slurm's names need no lookups, and reach rank 0's host."""

    name = "srun"

    def find_hosts(self, environ: Mapping[str, str], options: object) -> FoundHosts | None:
        """The allocation's nodes and task slots, and its task count (SLURM_NTASKS) as the default -np."""
        allocation = allocation_from_env(environ)
        return None if allocation is None else FoundHosts(allocation.hosts, allocation.num_tasks)

    def check_options(self, hosts: Sequence[Host] | None, environ: Mapping[str, str]) -> None:
        if not environ.get(JOB_ID):
            raise UsageError(
                f"--launcher srun needs a Slurm allocation (salloc, sbatch): {JOB_ID} is not set"
            )

    def open(
        self, hosts: Sequence[Host], config: LaunchConfig, progress: ProgressFn | None = None
    ) -> dict[str, Link]:
        from launcher.backends.bootstrap import agent_pythons

        names = [h.name for h in hosts]
        try:
            step = SrunStep(names, agent_pythons(config.python))
        except OSError as err:
            raise HostError(
                f"host {names[0]}: cannot run srun: {err.strerror or err}", host=names[0]
            ) from None
        try:
            links = step.gather(progress)
        except BaseException:
            step.end()
            raise
        for link in links.values():
            # Slurm's nodes resolve each other by these names: rank 0's is a MASTER_ADDR every node can use.
            link.peer_addr = link.host
        return dict(links)


BACKEND = SrunBackend()
