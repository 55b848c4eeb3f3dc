"""The `distrun` command line: options, environment and config file -> one validated `LaunchConfig`.

Errors only become exit codes and the one-line `distrun: error: ...` message in `main`.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

import click
from click.core import ParameterSource

from launcher import __version__
from launcher.command import resolve_command
from launcher.config import HostKeyPolicy, LaunchConfig, LauncherKind, PrefixMode, RestartOptions, SshOptions
from launcher.devices import Placement, RankDevices, assumed_hosts, describe, place_ranks
from launcher.env import join_host_port, parse_exports, parse_rank_filter, rank_env, redact
from launcher.errors import EXIT_OK, EXIT_SIGINT, DistrunError, UsageError
from launcher.facts import Rendezvous
from launcher.hosts import Host, parse_host_list, parse_hostfile
from launcher.locality import is_obviously_local
from launcher.plan import Plan, make_plan, plural
from launcher.slurm import JOB_ID, allocation_from_env

ENV_PREFIX = "DISTRUN"

_EPILOG = """\b
Examples:
  distrun -np 8 -H host1:4,host2:4 train.py
  distrun --hostfile hostfiles/cluster.txt python -m pkg.train --epochs 3
  distrun -np 4 examples/train.py

\b
Every option can also be set as DISTRUN_<OPTION> (DISTRUN_NUM_PROC=4, DISTRUN_HOSTS=a:4,b:4) or as a key
of the --config YAML file; the command line wins over the environment, which wins over the file.

\b
Exit codes: 0 every rank succeeded; 2 bad input; 3 a host unreachable, failing preflight or lost;
124 --timeout expired; 130/143 SIGINT/SIGTERM; 126/127 the command cannot run / is not found;
otherwise the first failing rank's exit code (128+N for signal N).
"""


_option = functools.partial(click.option, show_envvar=True)
_PORT = click.IntRange(1, 65535)


@dataclass(frozen=True)
class Request:
    """What the command line asked for: a launch, or only its plan (`--dry-run`)."""

    config: LaunchConfig
    dry_run: bool
    verbose: int = 0


# Where a value came from, for "CLI > DISTRUN_* env > config file > defaults".
_CONFIG_LEVEL = 1


def _level(source: ParameterSource | None) -> int:
    if source is ParameterSource.COMMANDLINE:
        return 3
    return 2 if source is ParameterSource.ENVIRONMENT else 0


@click.command(
    name="distrun",
    context_settings={
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
        "auto_envvar_prefix": ENV_PREFIX,
    },
    epilog=_EPILOG,
)
@_option("-np", "--num-proc", type=click.IntRange(min=1), help="Number of processes [default: every slot].")
@_option("-H", "--hosts", metavar="HOST[:SLOTS],...", help="Hosts: a:4,user@b:4,[fe80::1]:2.")
@_option("--hostfile", metavar="PATH", help="OpenMPI-style hostfile: 'host slots=N [max_slots=M]' lines.")
@_option("--master-addr", metavar="ADDR", help="Address of rank 0's host as every host reaches it.")
@_option("--master-port", type=_PORT, help="Rendezvous port [default: a free port on rank 0's host].")
@_option("-x", "--export", multiple=True, metavar="VAR[=VALUE]", help="Set VAR for every rank (repeatable).")
@_option("--prefix", type=click.Choice(["rank", "host", "none"]), default="rank", show_default=True)
@_option("--timestamp", is_flag=True, help="Prefix console lines with the time.")
@_option("--output-dir", metavar="DIR", help="Also write each rank's raw output to DIR.")
@_option("--ranks", metavar="LIST", help="Show only these ranks on the console, e.g. 0,2-3.")
@_option("--timeout", type=float, metavar="SECONDS", help="Stop the job after SECONDS (exit 124).")
@_option(
    "--max-restarts",
    type=click.IntRange(min=0),
    metavar="N",
    help="Restart the job up to N times when a rank fails or a host is lost [default: 0; 3 with --min-np].",
)
@_option(
    "--restart-delay",
    type=float,
    metavar="SECONDS",
    default=1.0,
    show_default=True,
    help="Pause before a restart.",
)
@_option(
    "--min-np",
    type=click.IntRange(min=1),
    metavar="N",
    help="Elastic: go on without lost hosts down to N ranks.",
)
@_option("--max-np", type=click.IntRange(min=1), metavar="N", help="Elastic: at most N ranks [default: -np].")
@_option(
    "--host-discovery-script",
    metavar="PATH",
    help="Elastic: executable printing 'host[:slots]' lines; new hosts join at the next restart.",
)
@_option(
    "--grace-period",
    type=float,
    metavar="SECONDS",
    default=5.0,
    show_default=True,
    help="SIGTERM to SIGKILL delay.",
)
@_option("--color/--no-color", default=None, help="Color the prefixes [default: when stdout is a terminal].")
@_option("--python", metavar="PATH", help="Interpreter for *.py commands [default: this one].")
@_option("--network-interface", metavar="IF", help="Interface for gloo/NCCL traffic (sets *_SOCKET_IFNAME).")
@_option(
    "--gpus-per-rank",
    type=click.IntRange(min=1),
    metavar="N",
    help="Give each rank N GPUs of its own (its CUDA_VISIBLE_DEVICES).",
)
@_option("--bind-cores", is_flag=True, help="Pin each rank to its own share of the host's cores.")
@_option(
    "--numa-binding", is_flag=True, help="Pin each rank to cores of its GPUs' NUMA node (--gpus-per-rank)."
)
@_option("--ssh-port", type=_PORT, help="SSH port [default: ~/.ssh/config, else 22].")
@_option(
    "-i",
    "--ssh-identity-file",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="SSH private key (repeatable).",
)
@_option(
    "--host-key-policy", type=click.Choice(["strict", "accept-new", "ignore"]), help="Unknown host keys."
)
@_option("--ssh-connect-timeout", type=float, metavar="SECONDS", default=10.0, show_default=True)
@_option(
    "--ssh-keepalive",
    type=float,
    metavar="SECONDS",
    default=2.0,
    show_default=True,
    help="Probe interval; a host is dead after 5 missed probes.",
)
@_option(
    "--launcher",
    type=click.Choice(["ssh", "srun", "local"]),
    help="How agents start: srun [default inside a Slurm allocation], ssh (local names run here), local.",
)
@_option("--config", metavar="PATH", help="YAML file of option defaults (keys: option names).")
@_option("--dry-run", is_flag=True, help="Print each rank's host and environment; run nothing.")
@_option("-v", "--verbose", count=True, help="Say more about what distrun does (-vv: SSH details too).")
@click.version_option(__version__, "--version", prog_name="distrun", message="%(prog)s %(version)s")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=False)
@click.pass_context
def cli(ctx: click.Context, /, **options: Any) -> Request:
    """Run COMMAND as one rank per slot on every host, with the torch/Horovod/TF environment set."""
    values, levels = _merge_config_file(ctx, options)
    return _build_request(values, levels)


def _config_params(ctx: click.Context) -> dict[str, click.Parameter]:
    return {
        p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name and p.expose_value
    }


def _load_config_file(path: str) -> dict[str, Any]:
    import yaml  # only config-file users pay for importing yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "it is not UTF-8 text"
        raise UsageError(f"cannot read config file {path}: {reason}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise UsageError(f"{where}: not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {path}: expected a mapping of option names to values")
    return data


def _merge_config_file(ctx: click.Context, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """Fill options still at their defaults from the --config file; report each option's precedence level."""
    values = dict(options)
    levels = {name: _level(ctx.get_parameter_source(name)) for name in options}
    path = options["config"]
    if path is None:
        return values, levels
    params = _config_params(ctx)
    params.pop("config")
    seen: dict[str, str] = {}
    for key, raw in _load_config_file(path).items():
        name = str(key).replace("-", "_")
        if name not in params:
            raise UsageError(f"config file {path}: unknown option {key!r}")
        if name in seen:
            raise UsageError(f"config file {path}: {seen[name]!r} and {key!r} set the same option")
        seen[name] = str(key)
        if raw is None or levels[name] > 0:
            continue
        param, value = params[name], raw
        if name == "hosts" and isinstance(value, list):
            value = ",".join(str(item) for item in value)
        if param.multiple and not isinstance(value, list):
            value = [value]
        elif not param.multiple and isinstance(value, (list, dict)):
            raise UsageError(f"config file {path}: {key!r} takes a single value")
        try:
            values[name] = param.type_cast_value(ctx, value)
        except click.BadParameter as err:
            raise UsageError(f"config file {path}: {key!r}: {err.message}") from None
        levels[name] = _CONFIG_LEVEL
    return values, levels


def _hosts(values: Mapping[str, Any], levels: Mapping[str, int]) -> tuple[Host, ...] | None:
    """-H or --hostfile, whichever was given at the higher precedence level; both at one level is an error."""
    hosts, hostfile = values["hosts"], values["hostfile"]
    if hosts is not None and hostfile is not None:
        if levels["hosts"] == levels["hostfile"]:
            raise UsageError("use either -H/--hosts or --hostfile, not both")
        if levels["hosts"] > levels["hostfile"]:
            hostfile = None
        else:
            hosts = None
    if hosts is not None:
        return parse_host_list(hosts)
    if hostfile is not None:
        return parse_hostfile(Path(hostfile))
    return None


def _output_dir(value: str | None) -> Path | None:
    """The directory may not exist yet (it is created at launch), but nothing on its path may be a file."""
    if value is None:
        return None
    path = Path(value)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(f"--output-dir {value}: {part} is a file, not a directory")
    return path


def _seconds(value: float, option: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be a positive number of seconds, got {value:g}")
    return value


def _word(value: str | None, option: str) -> str | None:
    if value is not None and (not value or any(c.isspace() for c in value)):
        raise UsageError(f"{option} {value!r}: expected one word")
    return value


def _restart_options(values: Mapping[str, Any], num_proc: int) -> RestartOptions:
    min_np, max_np = values["min_np"], values["max_np"]
    script = values["host_discovery_script"]
    if min_np is None and (max_np is not None or script is not None):
        given = "--max-np" if max_np is not None else "--host-discovery-script"
        raise UsageError(f"{given} makes the job elastic and needs --min-np")
    if min_np is not None:
        max_np = num_proc if max_np is None else max_np
        if not min_np <= num_proc <= max_np:
            raise UsageError(
                f"--min-np {min_np}, -np {num_proc} and --max-np {max_np} must satisfy min <= np <= max"
            )
    if script is not None:
        path = Path(script).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UsageError(f"--host-discovery-script {script}: not an executable file")
        script = path.resolve()
    max_restarts = values["max_restarts"]
    if max_restarts is None:
        max_restarts = 3 if min_np is not None else 0
    delay = values["restart_delay"]
    if not (math.isfinite(delay) and delay >= 0):
        raise UsageError(f"--restart-delay must be zero or a positive number of seconds, got {delay:g}")
    return RestartOptions(
        max_restarts=max_restarts, delay=delay, min_np=min_np, max_np=max_np, discovery_script=script
    )


def _build_request(values: Mapping[str, Any], levels: Mapping[str, int]) -> Request:
    command = tuple(values["command"])
    resolve_command(command, values["python"] or sys.executable)
    num_proc: int | None = values["num_proc"]
    hosts = _hosts(values, levels)
    launcher = cast("LauncherKind | None", values["launcher"])
    if launcher == "local" and hosts is not None:
        raise UsageError("--launcher local runs every rank on this machine: drop -H/--hostfile")
    if launcher == "srun" and not os.environ.get(JOB_ID):
        raise UsageError(f"--launcher srun needs a Slurm allocation (salloc, sbatch): {JOB_ID} is not set")
    allocation = allocation_from_env(os.environ) if hosts is None and launcher != "local" else None
    if allocation is not None:
        hosts = allocation.hosts
        num_proc = num_proc or allocation.num_tasks
    if launcher is None:
        launcher = "srun" if allocation is not None else "ssh"
    hosts = hosts or (Host("localhost", slots=num_proc or 1, origin="localhost (no -H)"),)
    plan = make_plan(hosts, num_proc)
    ranks = values["ranks"]
    placement = Placement(values["gpus_per_rank"], values["bind_cores"], values["numa_binding"])
    config = LaunchConfig(
        command=command,
        hosts=hosts,
        num_proc=plan.world_size,
        master_addr=_word(values["master_addr"], "--master-addr"),
        master_port=values["master_port"],
        exports=parse_exports(values["export"], os.environ),
        prefix=cast(PrefixMode, values["prefix"]),
        timestamp=values["timestamp"],
        output_dir=_output_dir(values["output_dir"]),
        console_ranks=None if ranks is None else parse_rank_filter(ranks, plan.world_size),
        timeout=None if values["timeout"] is None else _seconds(values["timeout"], "--timeout"),
        grace_period=_seconds(values["grace_period"], "--grace-period"),
        restart=_restart_options(values, plan.world_size),
        python=_word(values["python"], "--python"),
        network_interface=_word(values["network_interface"], "--network-interface"),
        gpus_per_rank=placement.gpus_per_rank,
        bind_cores=placement.bind_cores,
        numa_binding=placement.numa_binding,
        color=values["color"],
        ssh=SshOptions(
            port=values["ssh_port"],
            identity_files=tuple(values["ssh_identity_file"]),
            host_key_policy=cast("HostKeyPolicy | None", values["host_key_policy"]),
            connect_timeout=_seconds(values["ssh_connect_timeout"], "--ssh-connect-timeout"),
            keepalive_interval=_seconds(values["ssh_keepalive"], "--ssh-keepalive"),
        ),
        launcher=launcher,
    )
    return Request(config=config, dry_run=values["dry_run"], verbose=values["verbose"] or 0)


def format_dry_run(config: LaunchConfig, environ: Mapping[str, str]) -> str:
    """The plan, one header line per rank followed by its contract environment (secrets redacted)."""
    plan = make_plan(config.hosts, config.num_proc)
    python = config.python or sys.executable
    master_port = "auto" if config.master_port is None else str(config.master_port)
    # Ports are probed on the hosts at launch; distinct stand-ins satisfy rank_env, then show as "auto".
    rdzv = Rendezvous(
        master_addr=config.master_addr or plan.nodes[0].name,
        master_port=0,
        node_addrs=tuple(node.name for node in plan.nodes),
        tf_ports=tuple(tuple(s.rank for s in plan.node_slots(n)) for n in range(plan.node_count)),
    )
    workers = [join_host_port(rdzv.node_addrs[s.node_rank], "auto") for s in plan.slots]
    lines = [
        f"dry run: {plural(plan.world_size, 'process', 'processes')} on "
        f"{plural(plan.node_count, 'host', 'hosts')}; nothing is started",
        f"command: {shlex.join(resolve_command(config.command, python))}",
    ]
    if config.launcher != "ssh":
        lines.append(f"launcher: {config.launcher}")
    placed, placement_lines = _dry_run_placement(plan, config.placement)
    lines.extend(placement_lines)
    for slot in plan.slots:
        env, defaults = rank_env(
            slot,
            plan,
            rdzv,
            run_id="auto",
            exports=dict(config.exports),
            ifname=config.network_interface,
            launcher_env=environ if is_obviously_local(slot.host.name) else None,
            workers=workers,
            devices=placed[slot.rank] if placed else None,
        )
        env.update(MASTER_PORT=master_port)
        if config.placement.binds and "OMP_NUM_THREADS" in defaults:
            defaults["OMP_NUM_THREADS"] = "auto"  # the rank's core count, known once its host is probed
        host = slot.host.name if slot.host.user is None else f"{slot.host.user}@{slot.host.name}"
        lines.append(f"rank {slot.rank}: host={host} local_rank={slot.local_rank} node_rank={slot.node_rank}")
        lines.extend(f"    {name}={shlex.quote(value)}" for name, value in sorted(redact(env).items()))
        lines.extend(
            f"    {name}={shlex.quote(value)}  # unless the host sets it"
            for name, value in sorted(redact(defaults).items())
        )
    return "\n".join(lines)


def _dry_run_placement(plan: Plan, placement: Placement) -> tuple[tuple[RankDevices, ...], list[str]]:
    """Each rank's GPUs as the dry run assumes them, and lines saying what it assumes (it probes nothing)."""
    if not placement.active:
        return (), []
    lines = []
    gpus_only = Placement(gpus_per_rank=placement.gpus_per_rank)
    placed, _ = place_ranks(plan, assumed_hosts(plan, placement), gpus_only)
    if placement.gpus_per_rank is not None:
        lines.append(
            "GPUs, assuming each host shows enough, numbered from 0, and sets no CUDA_VISIBLE_DEVICES "
            "(at launch distrun hands out what each host shows, and refuses a host with too few):"
        )
        lines.extend(f"    {line}" for line in describe(plan, placed))
    if placement.binds:
        share = (
            "a share of the allowed cores of its GPUs' NUMA node (of the host's, where the node is unknown)"
            if placement.numa_binding
            else "an even share of its host's allowed cores"
        )
        lines.append(
            f"cores: at launch each rank is pinned to {share}, disjoint from the other ranks', and "
            "OMP_NUM_THREADS is its core count unless set"
        )
    return placed, lines


def _parse(argv: Sequence[str]) -> Request | int:
    """The request, or the exit code when click already answered (--help, --version)."""
    try:
        with cli.make_context("distrun", list(argv)) as ctx:
            return cast(Request, cli.invoke(ctx))
    except click.exceptions.Exit as done:
        return done.exit_code


def _run(argv: Sequence[str]) -> int:
    try:
        request = _parse(argv)
        if isinstance(request, int):
            return request
        _configure_logging(request.verbose)
        if request.dry_run:
            click.echo(format_dry_run(request.config, os.environ))
            return EXIT_OK
        from launcher.run import launch  # the runtime (and paramiko) load only when something starts

        return launch(request.config)
    except DistrunError as err:
        _error(str(err))
        return err.exit_code
    except click.ClickException as err:
        _error(err.format_message())
        return err.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        return EXIT_SIGINT


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(format="distrun: %(message)s", level=level, stream=sys.stderr)


def _error(message: str) -> None:
    click.echo(f"distrun: error: {' '.join(message.splitlines())}", err=True)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console-script entry point: parse, launch, exit with the job's exit code."""
    sys.exit(_run(sys.argv[1:] if argv is None else argv))
