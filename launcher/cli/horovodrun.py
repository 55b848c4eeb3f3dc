"""horovodrun's command line on distrun: every flag of horovodrun's parser that distrun does not already
spell the same way, with what it does here.

Each flag is one of five kinds: an alias of a distrun option (set as if that option had been given), a
tuning flag that sets the engine's ``HOROVOD_*`` variable on every rank (collectives honours it), a tuning
flag the engine has no use for, a controller/MPI flag for which distrun does something else, or
``--check-build`` (prints the build and exits, as horovodrun does). The third and fourth are accepted with one
line on stderr saying so, and so is the ``HOROVOD_*`` variable horovodrun would set from such a flag, given
in the ranks' environment instead (the same line). The options are hidden from ``--help``; docs/usage.md
maps every flag. horovodrun's elastic flags are the elastic driver's own options, not listed here. Long
options may be abbreviated as horovodrun's argparse parser allows (:func:`expand_abbreviations`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click
from click.core import ParameterSource

__all__ = [
    "FLAGS",
    "PARSER_LONG_NAMES",
    "Flag",
    "Kind",
    "expand_abbreviations",
    "flags_of_settings",
    "horovodrun_options",
    "notes",
    "translate",
]


class Kind(enum.Enum):
    ALIAS = "alias"  # ``target``: the distrun option's parameter name
    ENV = "env"  # ``target``: the HOROVOD_* variable set on every rank
    NO_EFFECT = "no effect"  # ``target``: why
    INSTEAD = "instead"  # ``target``: what distrun does instead
    BUILD = "build"  # ``target``: what it prints (the command line stops there, as horovodrun's does)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One of horovodrun's flags, and what distrun does with it."""

    names: tuple[str, ...]
    kind: Kind
    target: str
    takes_value: bool = True
    # ENV flags: horovodrun's value -> the variable's value; a flag without a value sets ``constant``.
    convert: Callable[[str], str] = str
    constant: str = "1"
    # NO_EFFECT/INSTEAD flags: the HOROVOD_* variable that asks for the same (horovodrun sets it from the
    # flag); a rank's environment giving it is said in the flag's line. A flag without a value stands for
    # the variable's ``constant`` (its ``--no-`` twin for "0").
    variable: str | None = None

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
        variable="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    ),
    *(
        Flag((name,), Kind.NO_EFFECT, _TUNING, takes_value=False, variable=variable, constant=constant)
        for switch, variable in (
            ("hierarchical-allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE"),
            ("hierarchical-allgather", "HOROVOD_HIERARCHICAL_ALLGATHER"),
            ("torus-allreduce", "HOROVOD_TORUS_ALLREDUCE"),
            ("autotune", "HOROVOD_AUTOTUNE"),
            ("timeline-mark-cycles", "HOROVOD_TIMELINE_MARK_CYCLES"),
            ("mpi-threads-disable", "HOROVOD_MPI_THREADS_DISABLE"),
        )
        for name, constant in ((f"--{switch}", "1"), (f"--no-{switch}", "0"))
    ),
    *(
        Flag((name,), Kind.NO_EFFECT, _TUNING, variable=variable)
        for name, variable in (
            ("--autotune-log-file", "HOROVOD_AUTOTUNE_LOG"),
            ("--autotune-warmup-samples", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"),
            ("--autotune-steps-per-sample", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"),
            ("--autotune-bayes-opt-max-samples", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"),
            ("--autotune-gaussian-process-noise", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"),
        )
    ),
    Flag(
        ("--timeline-filename",),
        Kind.NO_EFFECT,
        "no timeline: use torch.profiler, or --report",
        variable="HOROVOD_TIMELINE",
    ),
    # One flag each, so that the line names the one given.
    *(
        Flag(
            (name,),
            Kind.NO_EFFECT,
            "collectives logs through Python's logging; --timestamp prefixes distrun's console lines",
            takes_value=False,
            variable="HOROVOD_LOG_HIDE_TIME",
            constant=constant,
        )
        for name, constant in (
            ("--log-with-timestamp", "0"),
            ("--log-without-timestamp", "1"),
            ("--log-hide-timestamp", "1"),
            ("--no-log-hide-timestamp", "0"),
        )
    ),
    Flag(
        ("--disable-cache",),
        Kind.NO_EFFECT,
        "distrun caches no host checks; each launch checks every host",
        takes_value=False,
    ),
    Flag(
        ("-cb", "--check-build"),
        Kind.BUILD,
        "prints this machine's build (collectives' frameworks, controllers and tensor operations) and exits; "
        "`distrun check` reports every host's Python, torch, CUDA and NCCL",
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
    Flag(
        ("--num-nccl-streams",),
        Kind.INSTEAD,
        "torch.distributed's NCCL process group manages its streams",
        variable="HOROVOD_NUM_NCCL_STREAMS",
    ),
    Flag(
        ("--thread-affinity",),
        Kind.INSTEAD,
        "--bind-cores pins each rank to its share of the cores",
        variable="HOROVOD_THREAD_AFFINITY",
    ),
)

_LOG_LEVELS = {"TRACE": 2, "DEBUG": 1}

# The long options of horovodrun's parser (horovod/runner/launch.py) and argparse's own --help: an
# abbreviation is a prefix of exactly one of these.
PARSER_LONG_NAMES = (
    "--help", "--version", "--num-proc", "--check-build", "--disable-cache", "--start-timeout",
    "--network-interfaces", "--network-interface", "--output-filename", "--verbose", "--config-file",
    "--ssh-port", "--ssh-identity-file", "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity",
    "--hierarchical-allreduce", "--no-hierarchical-allreduce", "--hierarchical-allgather",
    "--no-hierarchical-allgather", "--torus-allreduce", "--no-torus-allreduce", "--autotune",
    "--no-autotune", "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--min-np", "--min-num-proc",
    "--max-np", "--max-num-proc", "--slots-per-host", "--elastic-timeout", "--reset-limit",
    "--blacklist-cooldown-range", "--timeline-filename", "--timeline-mark-cycles",
    "--no-timeline-mark-cycles", "--no-stall-check", "--stall-check", "--stall-check-warning-time-seconds",
    "--stall-check-shutdown-time-seconds", "--mpi-threads-disable", "--no-mpi-threads-disable",
    "--mpi-args", "--tcp", "--binding-args", "--num-nccl-streams", "--thread-affinity",
    "--gloo-timeout-seconds", "--log-level", "--log-with-timestamp", "--log-without-timestamp",
    "--prefix-output-with-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp", "--hosts",
    "--hostfile", "--host-discovery-script", "--gloo", "--mpi", "--jsrun",
)  # fmt: skip


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


def translate(ctx: click.Context, options: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Flag, ...]]:
    """``options`` without the horovodrun flags, each applied: aliases set their distrun option (unless
    that was given too), ENV flags add ``-x HOROVOD_*=...``; and the flags given that are only said
    (:func:`notes` words them)."""
    values = {name: value for name, value in options.items() if not name.startswith("horovodrun_")}
    exports = list(values.get("export") or ())
    said: list[Flag] = []
    for flag in FLAGS:
        given = options.get(flag.param)
        if given is None or given is False:
            continue
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
        elif flag.kind is not Kind.BUILD:
            said.append(flag)
    if exports:
        values["export"] = tuple(exports)
    return values, tuple(said)


def _off(value: str) -> bool:
    """Horovod's reading of a boolean variable: "0", "false" or nothing is off."""
    return value.strip().lower() in ("", "0", "false")


def flags_of_settings(settings: Mapping[str, str]) -> tuple[Flag, ...]:
    """The flags that the ``HOROVOD_*`` variables of ``settings`` (the ranks' environment) stand for, among
    those distrun only says something about: horovodrun sets these variables from those flags."""
    found: dict[str, Flag] = {}
    for flag in FLAGS:
        if flag.variable is None or flag.variable not in settings or flag.variable in found:
            continue  # the first of a variable's flags names it (horovodrun's deprecated spellings follow)
        value = settings[flag.variable]
        if flag.takes_value or (flag.constant == "0") == _off(value):
            found[flag.variable] = flag
    return tuple(found.values())


def notes(flags: Sequence[Flag]) -> list[str]:
    """One line for each flag (given, or stood for by its variable), once however often it was said."""
    lines: list[str] = []
    for flag in FLAGS:
        if flag not in flags:
            continue
        spelled = flag.names[-1] + (f" ({flag.variable})" if flag.variable else "")
        if flag.kind is Kind.NO_EFFECT:
            lines.append(f"distrun: horovodrun's {spelled} has no effect here: {flag.target}")
        else:
            lines.append(f"distrun: horovodrun's {spelled} is not needed: {flag.target}")
    return lines


def expand_abbreviations(argv: Sequence[str], params: Sequence[click.Parameter]) -> list[str]:
    """``argv`` with each ``--`` option that is none of ``params``' names but a prefix of one of
    horovodrun's long options spelled out, as horovodrun's argparse parser reads it (``--slots 4`` is
    ``--slots-per-host 4``). The options end at the command (its own options are its own) or at ``--``.

    Raises click.UsageError for a prefix of several of horovodrun's options, as argparse refuses it."""
    takes: dict[str, int] = {}
    for param in params:
        if isinstance(param, click.Option):
            count = 0 if param.is_flag or param.count else param.nargs
            takes.update(dict.fromkeys((*param.opts, *param.secondary_opts), count))
    expanded: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        name, equals, value = arg.partition("=")
        if name.startswith("--") and name not in takes:
            matches = [option for option in PARSER_LONG_NAMES if option.startswith(name)]
            if len(matches) > 1:
                raise click.UsageError(
                    f"ambiguous option {name}: it could be horovodrun's {', '.join(matches)}"
                )
            if matches:
                name = matches[0]
                arg = name + equals + value
        expanded.append(arg)
        index += 1
        count = max(0, takes.get(name, 0) - (1 if equals else 0))
        expanded.extend(argv[index : index + count])
        index += count
    return [*expanded, *argv[index:]]
