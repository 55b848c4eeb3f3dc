"""The validated launch request: everything the CLI, config file and environment said, as one frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.core.devices import Placement
from launcher.core.forward import JobEnv, job_env
from launcher.core.hosts import Host
from launcher.core.plan import PlanInputs

PrefixMode = Literal["rank", "host", "none"]


@dataclass(frozen=True)
class RestartOptions:
    """When and how an attempt that failed is followed by another (see docs/attempts.md).

    `min_np` set makes the job elastic: a lost host is left out and the job goes on with fewer ranks, down to
    `min_np`; `max_np` caps how many ranks hosts found by `discovery_script` may bring it back up to.
    """

    max_restarts: int = 0
    delay: float = 1.0
    min_np: int | None = None
    max_np: int | None = None
    discovery_script: Path | None = None
    # --blacklist-cooldown-range MIN MAX: a host left out comes back after a growing cooldown; None: never.
    cooldown_range: tuple[float, float] | None = None
    # --elastic-timeout: how long an elastic job waits for --min-np slots (a cooldown's end, discovery).
    elastic_timeout: float = 600.0
    # Resets in place (ranks that opted in to hvd.elastic) the job may make; None: no limit.
    reset_limit: int | None = None
    # --slots-per-host: slots of a discovered host whose line names none; `discovered_first`: the job's first
    # hosts came from the discovery script (its first call answered).
    slots_per_host: int | None = None
    discovered_first: bool = False

    @property
    def elastic(self) -> bool:
        return self.min_np is not None


@dataclass(frozen=True)
class LaunchConfig:
    """A launch request after parsing; `command` is what every worker runs, argv-style, untouched."""

    command: tuple[str, ...]
    hosts: tuple[Host, ...]
    num_proc: int
    master_addr: str | None = None
    master_port: int | None = None
    exports: tuple[tuple[str, str], ...] = ()
    # What --env-file set (before -x); False: ranks do not start from the launcher's environment.
    env_file: tuple[tuple[str, str], ...] = ()
    forward_env: bool = True
    redact: tuple[str, ...] = ()  # --redact globs: names whose values are never printed
    oversubscribe: bool = False
    report: Path | None = None  # --report: the run's account as JSON
    prefix: PrefixMode = "rank"
    timestamp: bool = False
    progress_interval: float = 5.0
    output_dir: Path | None = None
    console_ranks: frozenset[int] | None = None
    timeout: float | None = None
    stall_timeout: float | None = None  # show every rank's stacks when no rank wrote anything this long
    startup_timeout: float = 180.0  # a host's login shell and agent start, until its agent answers
    stack_tool: Literal["auto", "py-spy", "python"] = "auto"
    straggler_window: float = 60.0  # a rank slower than the others this long is named
    grace_period: float = 5.0
    restart: RestartOptions = field(default_factory=RestartOptions)
    python: str | None = None
    network_interface: str | None = None
    gpus_per_rank: int | None = None
    bind_cores: bool = False
    numa_binding: bool = False
    color: bool | None = None
    # The backend's name (`launcher.backends.api.get`): ssh (remote hosts over SSH, this machine through a
    # local agent; the default outside Slurm), srun (steps of the Slurm allocation), local (this machine).
    launcher: str = "ssh"
    # Backend name -> the validated value of that backend's own options (`Backend.parse_options`).
    backend_options: Mapping[str, object] = field(default_factory=dict)
    # --workdir: the directory synced to every host's cache, where ranks then run; the size refused above.
    workdir: Path | None = None
    workdir_limit: int = 200 << 20
    workdir_relay: bool = True  # hosts with the copy feed the others (see launcher.workdir.sync)
    allow_mismatch: bool = False
    preflight: bool = False  # measure hosts and links before any rank starts (launcher.check.perf)
    sample_interval: float = 2.0  # seconds between the agents' samples of each rank (0: none; `distrun top`)

    @property
    def placement(self) -> Placement:
        return Placement(self.gpus_per_rank, self.bind_cores, self.numa_binding)

    def job_env(self, environ: Mapping[str, str]) -> JobEnv:
        """What every rank starts from beneath the contract: this shell's environment as forwarded, the
        env-files, `-x`; the same for every attempt."""
        return job_env(environ, forward=self.forward_env, env_file=self.env_file, exports=self.exports)

    @property
    def plan_inputs(self) -> PlanInputs:
        return PlanInputs(self.hosts, self.num_proc, self.oversubscribe)
