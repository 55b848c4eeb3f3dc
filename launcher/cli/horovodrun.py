"""horovodrun's command line on distrun: every flag of horovodrun's parser that distrun does not already
spell the same way, with what it does here.

Each flag is one of four kinds: an alias of a distrun option (set as if that option had been given), a
tuning flag that sets the engine's ``HOROVOD_*`` variable on every rank (collectives honours it), a tuning
flag the engine has no use for, or a controller/MPI flag for which distrun does something else; the last two
are accepted with one line on stderr saying so. The options are hidden from ``--help``; docs/usage.md maps
every flag. horovodrun's elastic flags are the elastic driver's own options, not listed here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

import click
from click.core import ParameterSource

__all__ = ["FLAGS", "Flag", "Kind", "horovodrun_options", "translate"]


class Kind(enum.Enum):
    ALIAS = "alias"  # ``target``: the distrun option's parameter name
    ENV = "env"  # ``target``: the HOROVOD_* variable set on every rank
    NO_EFFECT = "no effect"  # ``target``: why
    INSTEAD = "instead"  # ``target``: what distrun does instead


@dataclasses.dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    kind: Kind
    target: str
    takes_value: bool = True
    # ENV flags: horovodrun's value -> the variable's value; a flag without a value sets ``constant``.
    convert: Callable[[str], str] = str
    constant: str = "1"

    @property
    def param(self) -> str:
        """The hidden click parameter's name (never one of distrun's)."""
        return "horovodrun_" + self.names[-1].lstrip("-").replace("-", "_")


def _megabytes(value: str) -> str:
    return str(int(float(value) * 1024 * 1024))


_NO_MPI = "distrun starts the ranks itself (ssh, srun or local agents) and sets up torch.distributed; no MPI"
_TUNING = "collectives' engine has no such setting (it honours fusion, cycle time, stall check, gloo timeout)"

FLAGS: tuple[Flag, ...] = (
    # Aliases of distrun's options.
    Flag(("-p",), Kind.ALIAS, "ssh_port"),
    Flag(("--start-timeout",), Kind.ALIAS, "startup_timeout"),
    Flag(("--output-filename",), Kind.ALIAS, "output_dir"),
    Flag(("--config-file",), Kind.ALIAS, "config"),
    Flag(("--network-interfaces",), Kind.ALIAS, "network_interface"),
    Flag(("--min-num-proc",), Kind.ALIAS, "min_np"),
    Flag(("--max-num-proc",), Kind.ALIAS, "max_np"),
    Flag(("-hostfile",), Kind.ALIAS, "hostfile"),
    Flag(("-prefix-timestamp", "--prefix-output-with-timestamp"), Kind.ALIAS, "timestamp", takes_value=False),
    Flag(("--log-level",), Kind.ALIAS, "verbose"),
    # Tuning variables the engine honours, set on every rank.
    Flag(("--fusion-threshold-mb",), Kind.ENV, "HOROVOD_FUSION_THRESHOLD", convert=_megabytes),
    Flag(("--cycle-time-ms",), Kind.ENV, "HOROVOD_CYCLE_TIME"),
    Flag(("--no-stall-check",), Kind.ENV, "HOROVOD_STALL_CHECK_DISABLE", takes_value=False),
    Flag(("--stall-check",), Kind.ENV, "HOROVOD_STALL_CHECK_DISABLE", takes_value=False, constant="0"),
    Flag(("--stall-check-warning-time-seconds",), Kind.ENV, "HOROVOD_STALL_CHECK_TIME_SECONDS"),
    Flag(("--gloo-timeout-seconds",), Kind.ENV, "HOROVOD_GLOO_TIMEOUT_SECONDS"),
    Flag(("--cache-capacity",), Kind.ENV, "HOROVOD_CACHE_CAPACITY"),
    # Tuning the engine has no use for.
    Flag(
        ("--stall-check-shutdown-time-seconds",),
        Kind.NO_EFFECT,
        "the stall check only warns here; --stall-timeout ends a job whose ranks stop printing",
    ),
    *(
        Flag((name,), Kind.NO_EFFECT, _TUNING, takes_value=False)
        for name in (
            "--hierarchical-allreduce",
            "--no-hierarchical-allreduce",
            "--hierarchical-allgather",
            "--no-hierarchical-allgather",
            "--torus-allreduce",
            "--no-torus-allreduce",
            "--autotune",
            "--no-autotune",
            "--timeline-mark-cycles",
            "--no-timeline-mark-cycles",
            "--mpi-threads-disable",
            "--no-mpi-threads-disable",
        )
    ),
    *(
        Flag((name,), Kind.NO_EFFECT, _TUNING)
        for name in (
            "--autotune-log-file",
            "--autotune-warmup-samples",
            "--autotune-steps-per-sample",
            "--autotune-bayes-opt-max-samples",
            "--autotune-gaussian-process-noise",
        )
    ),
    Flag(("--timeline-filename",), Kind.NO_EFFECT, "no timeline: use torch.profiler, or --report"),
    Flag(
        (
            "--log-with-timestamp",
            "--log-without-timestamp",
            "--log-hide-timestamp",
            "--no-log-hide-timestamp",
        ),
        Kind.NO_EFFECT,
        "collectives logs through Python's logging; --timestamp prefixes distrun's console lines",
        takes_value=False,
    ),
    Flag(
        ("--disable-cache",),
        Kind.NO_EFFECT,
        "distrun caches no host checks; each launch checks every host",
        takes_value=False,
    ),
    Flag(
        ("-cb", "--check-build"),
        Kind.INSTEAD,
        "`distrun check` reports each host's Python, torch, CUDA and NCCL; collectives' build queries "
        "(hvd.nccl_built() ...) answer in a rank",
        takes_value=False,
    ),
    # Controllers and MPI.
    Flag(
        ("--gloo",),
        Kind.INSTEAD,
        "ranks meet through torch.distributed (gloo on CPUs, NCCL on GPUs), with no controller to choose",
        takes_value=False,
    ),
    Flag(("--mpi",), Kind.INSTEAD, _NO_MPI, takes_value=False),
    Flag(
        ("--jsrun",), Kind.INSTEAD, _NO_MPI + "; under LSF, start it with --launcher ssh", takes_value=False
    ),
    Flag(("--mpi-args",), Kind.INSTEAD, _NO_MPI),
    Flag(("--tcp",), Kind.INSTEAD, "traffic is TCP unless NCCL finds InfiniBand", takes_value=False),
    Flag(("--binding-args",), Kind.INSTEAD, "--bind-cores and --numa-binding pin the ranks"),
    Flag(("--num-nccl-streams",), Kind.INSTEAD, "torch.distributed's NCCL process group manages its streams"),
    Flag(("--thread-affinity",), Kind.INSTEAD, "--bind-cores pins each rank to its share of the cores"),
)

_LOG_LEVELS = {"TRACE": 2, "DEBUG": 1}


def horovodrun_options(function: Any) -> Any:
    """Add every flag of :data:`FLAGS` to a click command, hidden from --help."""
    for flag in reversed(FLAGS):
        function = click.option(
            *flag.names,
            flag.param,
            is_flag=not flag.takes_value,
            default=None,
            hidden=True,
            allow_from_autoenv=False,
            expose_value=True,
        )(function)
    return function


def translate(ctx: click.Context, options: Mapping[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    """``options`` without the horovodrun flags, each applied: aliases set their distrun option (unless
    that was given too), ENV flags add ``-x HOROVOD_*=...``, the rest are said once each."""
    values = {name: value for name, value in options.items() if not name.startswith("horovodrun_")}
    exports = list(values.get("export") or ())
    for flag in FLAGS:
        given = options.get(flag.param)
        if given is None or given is False:
            continue
        spelled = flag.names[-1]
        if flag.kind is Kind.ALIAS:
            value: Any = given
            if flag.target == "verbose":
                value = _LOG_LEVELS.get(str(given).upper(), 0)
            if flag.target == "network_interface":
                value = str(given).split(",")[0]
            if ctx.get_parameter_source(flag.target) in (None, ParameterSource.DEFAULT):
                target = next(p for p in ctx.command.params if p.name == flag.target)
                values[flag.target] = target.type_cast_value(ctx, value)
                ctx.set_parameter_source(flag.target, ParameterSource.COMMANDLINE)
        elif flag.kind is Kind.ENV:
            variable = flag.convert(str(given)) if flag.takes_value else flag.constant
            exports.append(f"{flag.target}={variable}")
        elif flag.kind is Kind.NO_EFFECT:
            say(f"distrun: horovodrun's {spelled} has no effect here: {flag.target}")
        else:
            say(f"distrun: horovodrun's {spelled} is not needed: {flag.target}")
    if exports:
        values["export"] = tuple(exports)
    return values
