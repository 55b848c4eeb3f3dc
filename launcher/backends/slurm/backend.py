"""Inside a Slurm allocation: every host's agent in one `srun` step, each dialing home to distrun over TCP.

One step for the whole job is what a Slurm user would start by hand: one request to slurmctld, one launch that
slurmd fans out along its own tree, one srun client. Every task of the step reads the same bootstrap on its
stdin (the agent's sources, then the invitation: distrun's addresses, port and the job's secret) and connects
back (`launcher.agent.homing`); feeding them and gathering them is `launcher.backends.dialhome`'s, this
module says only srun's command line. From then on each agent's connection is its link, with the same
protocol and heartbeats as over SSH.

Nothing outlives distrun: its sockets close with it, even on SIGKILL, and each agent seeing EOF stops its
ranks and exits, which ends the step; an agent cut off silently stops them when the heartbeats stop. A node
lost mid-job is dropped alone (`--kill-on-bad-exit=0`); the others go on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.backends.api import Backend, FoundHosts
from launcher.backends.slurm.allocation import JOB_ID, allocation_from_env, srun_step_argv
from launcher.core.hosts import Host
from launcher.core.progress import ProgressFn
from launcher.errors import UsageError

if TYPE_CHECKING:
    from launcher.backends.link import Link
    from launcher.core.config import LaunchConfig

# srun's lines that say nothing the agent has not said better: "srun: error: node01: task 0: Exited with exit
# code 127", and the notice that a cluster without task/affinity ignores --cpu-bind.
_SRUN_NOISE = re.compile(r"srun: (error: \S+: tasks? [0-9,-]+: |.*lacks support for cpu binding)")


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
        # Only a job that starts a step loads these: every launch's command line reads this module's options.
        from launcher.backends.bootstrap import agent_pythons
        from launcher.backends.dialhome import Starter, open_step

        srun = Starter("srun", srun_step_argv, _SRUN_NOISE)
        links = open_step([h.name for h in hosts], agent_pythons(config.python), srun, progress)
        for link in links.values():
            # Slurm's names resolve on every node: rank 0's is a MASTER_ADDR every node can use.
            link.peer_addr = link.host
        return dict(links)


BACKEND = SrunBackend()
