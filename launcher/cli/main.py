"""The `distrun` command line: options, environment and config file -> one validated `LaunchConfig`.

Errors only become exit codes and the one-line `distrun: error: ...` message in `main`. The config file's
layering is launcher/cli/config_file.py, check's output launcher/check/run.py, ssh-setup's prompt
launcher/backends/ssh/setup.py. Over 400 lines because every option is a declaration here and is validated
here, in
one place, for the launch and `distrun check` alike.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

import click

from launcher import __version__, release_start_guard, without_gc
from launcher.backends import api as backend
from launcher.backends.api import Backend, FoundHosts
from launcher.backends.locality import refuse_this_machine_twice, runs_here
from launcher.backends.ssh.options import HostKeyPolicy, SshOptions
from launcher.cli.backend_options import backend_values, backends_of, declared, named_launcher, with_backend
from launcher.cli.config_file import ENV_LEVEL, Sources, bad_value_message, merge_config_file
from launcher.cli.plot import plot_cli
from launcher.cli.top import top_cli
from launcher.console.writer import guard_std_fds
from launcher.core.command import interpreter, resolve_command
from launcher.core.config import LaunchConfig, PrefixMode, RestartOptions
from launcher.core.devices import Placement
from launcher.core.env import CONTRACT_NAMES, OWN_GPUS_VAR, parse_exports, parse_rank_filter
from launcher.core.forward import parse_env_file
from launcher.core.hosts import Host, parse_host_list, parse_hostfile
from launcher.core.plan import PlanInputs, build_plan, implicit_localhost, plural
from launcher.core.scrub import SCRUBBER
from launcher.errors import EXIT_OK, EXIT_SIGINT, DistrunError, HostError, Interrupted, UsageError
from launcher.report.file import ReportPathError, check_room

ENV_PREFIX = "DISTRUN"
# What distrun sets in each rank's environment, not settings of distrun (see launcher/core/env.py).
RANK_VARIABLES = frozenset({*(n for n in CONTRACT_NAMES if n.startswith(f"{ENV_PREFIX}_")), OWN_GPUS_VAR})
log = logging.getLogger(__name__)

_EPILOG = """\b
Examples:
  distrun -np 8 -H host1:4,host2:4 train.py
  distrun --hostfile hostfiles/cluster.txt python -m pkg.train --epochs 3
  distrun -np 4 examples/train.py

\b
Every option can also be set as DISTRUN_<OPTION> (DISTRUN_NUM_PROC=4, DISTRUN_HOSTS=a:4,b:4) or as a key
of the --config YAML file; the command line wins over the environment, which wins over the file.

\b
Subcommands (the first word only; `distrun -- check` launches a command of that name):
  distrun check -H host1:4,host2:4     is every host ready for a launch? (see its --help)
  distrun ssh-setup -H host1,host2     passwordless SSH to every host
  distrun stacks [PID]                 every rank's stacks of your running job, grouped
  distrun top [--once [--json]]        your running job live: CPU, memory, GPU, step rate per rank
  distrun plot REPORT.json -o run.png  one picture of a run from its --report

\b
Exit codes: 0 every rank succeeded; 2 bad input; 3 a host unreachable, failing preflight or lost;
124 --timeout expired; 130/143/129/131 SIGINT/SIGTERM/SIGHUP/SIGQUIT; 126/127 the command cannot run / is
not found; 3 also when an elastic job falls below --min-np;
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
@_option("--env-file", multiple=True, metavar="PATH", help="KEY=VALUE lines for every rank (before -x).")
@_option(
    "--forward-env/--no-forward-env",
    default=True,
    show_default=True,
    help="Start every rank from this shell's environment (less a deny-list).",
)
@_option(
    "--redact", multiple=True, metavar="GLOB", help="Never print values of these variables (repeatable)."
)
@_option("--report", metavar="FILE.json", help="Write the run's account as JSON (docs/report.schema.json).")
@_option(
    "--oversubscribe", is_flag=True, help="Allow more ranks than slots (max_slots, or this machine's cores)."
)
@_option("--prefix", type=click.Choice(["rank", "host", "none"]), default="rank", show_default=True)
@_option("--timestamp", is_flag=True, help="Prefix console lines with the time.")
@_option("--output-dir", metavar="DIR", help="Also write each rank's raw output to DIR.")
@_option("--ranks", metavar="LIST", help="Show only these ranks on the console, e.g. 0,2-3.")
@_option(
    "--timeout",
    type=float,
    metavar="SECONDS",
    help="Stop the job after SECONDS, showing every rank's stacks (exit 124).",
)
@_option(
    "--stall-timeout",
    type=float,
    metavar="SECONDS",
    help="When no rank has written anything for SECONDS, show every rank's stacks (once per stall).",
)
@_option(
    "--startup-timeout",
    type=float,
    metavar="SECONDS",
    default=180.0,
    show_default=True,
    help="Give up on a host whose login shell and agent have not started and answered in SECONDS.",
)
@_option(
    "--stack-tool",
    type=click.Choice(["auto", "py-spy", "python"]),
    default="auto",
    show_default=True,
    help="How ranks' stacks are read: py-spy (native frames too), python (the standard library), auto.",
)
@_option(
    "--straggler-after",
    type=float,
    metavar="SECONDS",
    default=60.0,
    show_default=True,
    help="Name a rank whose progress bar stays 25% below the median rate this long.",
)
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
    help="SIGTERM (Ctrl-C: SIGINT) to SIGKILL delay.",
)
@_option(
    "--progress-interval",
    type=float,
    metavar="SECONDS",
    default=5.0,
    show_default=True,
    help="Off a terminal, write a rank's progress-bar redraws as lines at most this often (0: every one).",
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
@declared(backend.table())
@_option(
    "--launcher",
    type=click.Choice(backend.names()),
    help="How agents start: srun [default inside a Slurm allocation], ssh (local names run here), local.",
)
@_option(
    "--workdir",
    metavar="DIR",
    help="Copy DIR to every host's cache (only what a host lacks travels); ranks run in that copy.",
)
@_option(
    "--workdir-limit",
    type=click.IntRange(min=1),
    metavar="MIB",
    default=200,
    show_default=True,
    help="Refuse a --workdir bigger than this many MiB.",
)
@_option(
    "--workdir-relay/--no-workdir-relay",
    default=True,
    show_default=True,
    help="Hosts that have the --workdir copy feed the others over TCP (token-checked, not encrypted).",
)
@_option(
    "--allow-mismatch",
    is_flag=True,
    help="Run even where hosts differ in workdir copy, Python, torch, CUDA or NCCL (warn only).",
)
@_option(
    "--preflight",
    is_flag=True,
    help="Before any rank starts, measure every host and link as `check --perf` does: an outlier ends a "
    "fixed-size job (exit 3); an elastic one (--min-np) leaves it out.",
)
@_option(
    "--sample-interval",
    type=float,
    metavar="SECONDS",
    default=2.0,
    show_default=True,
    help="Sample each rank's CPU, memory and GPU this often, for `distrun top` and --report (0: off).",
)
@_option("--config", metavar="PATH", help="YAML file of option defaults (keys: option names).")
@_option("--dry-run", is_flag=True, help="Print each rank's host and environment; run nothing.")
@_option("-v", "--verbose", count=True, help="Say more about what distrun does (-vv: SSH details too).")
@click.version_option(__version__, "--version", prog_name="distrun", message="%(prog)s %(version)s")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=False)
@click.pass_context
def cli(ctx: click.Context, /, **options: Any) -> Request:
    """Run COMMAND as one rank per slot on every host, with the torch/Horovod/TF environment set."""
    values, sources = merge_config_file(ctx, options)
    return _build_request(values, sources, backends_of(ctx.command))


def _hosts(values: Mapping[str, Any], sources: Sources) -> tuple[Host, ...] | None:
    """-H or --hostfile, whichever was given at the higher precedence level; both at one level is an error."""
    hosts, hostfile = values["hosts"], values["hostfile"]
    levels = sources.levels
    if hosts is not None and hostfile is not None:
        if levels["hosts"] == levels["hostfile"]:
            raise UsageError("use either -H/--hosts or --hostfile, not both")
        if levels["hosts"] > levels["hostfile"]:
            hostfile = None
        else:
            hosts = None
    if hosts is not None:
        return parse_host_list(hosts, sources.label("hosts", "-H"))
    if hostfile is not None:
        return parse_hostfile(Path(hostfile).expanduser())
    return None


def _output_dir(value: str | None, label: str) -> Path | None:
    """The directory may not exist yet (it is created at launch), but nothing on its path may be a file."""
    if value is None:
        return None
    path = Path(value).expanduser()
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(f"{label} {value}: {part} is a file, not a directory")
    return path


def _seconds(value: float, option: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be a positive number of seconds, got {value:g}")
    return value


def _interval(value: float, option: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{option} must be zero or a positive number of seconds, got {value:g}")
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


def _exports(values: Mapping[str, Any], sources: Sources) -> tuple[tuple[str, str], ...]:
    """The file's exports, then the command line's (or DISTRUN_EXPORT's), which win name by name."""
    given = tuple(values["export"])
    in_file = sources.file_counts.get("export", 0)
    exports = dict(parse_exports(given[:in_file], os.environ, sources.file_labels.get("export", "-x")))
    from_env = sources.levels["export"] == ENV_LEVEL
    label = sources.label("export", "-x")  # DISTRUN_EXPORT (-x/--export) where it came from there
    exports.update(parse_exports(given[in_file:], os.environ, label, split_on_blanks=from_env))
    return tuple(exports.items())


def _report_path(value: str | None, label: str) -> Path | None:
    """Checked before the run, so that a long job does not end by failing to write its report."""
    if value is None:
        return None
    path = Path(value).expanduser()
    try:
        check_room(path)
    except ReportPathError as err:
        raise ReportPathError(str(err).replace("--report", label, 1)) from None
    return path


def _workdir(value: str | None, label: str) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UsageError(f"{label} {value}: not a directory")
    return path.resolve()


def _env_files(paths: Sequence[str]) -> tuple[tuple[str, str], ...]:
    merged: dict[str, str] = {}
    for path in paths:
        merged.update(parse_env_file(Path(path), os.environ))
    return tuple(merged.items())


def _redact_patterns(patterns: Sequence[str], label: str) -> tuple[str, ...]:
    for pattern in patterns:
        if not pattern.strip():
            raise UsageError(f"{label}: expected a variable name or glob such as 'MYCO_*'")
    return tuple(patterns)


def _found_hosts(
    chosen: Backend | None, backends: Sequence[Backend], options: Mapping[str, object]
) -> tuple[Backend | None, FoundHosts | None]:
    """Hosts from the environment when neither -H nor --hostfile gave any: the chosen backend's own source,
    else (when it borrows hosts) the first backend's that finds some; with no --launcher, the backend that
    found them is the one chosen."""
    if chosen is not None:
        found = chosen.find_hosts(os.environ, options.get(chosen.name))
        if found is not None or not chosen.borrows_hosts:
            return chosen, found
    for candidate in backends:
        if candidate is not chosen:
            found = candidate.find_hosts(os.environ, options.get(candidate.name))
            if found is not None:
                return chosen or candidate, found
    return chosen, None


def _build_request(values: Mapping[str, Any], sources: Sources, backends: Sequence[Backend]) -> Request:
    command = tuple(values["command"])
    resolve_command(command, interpreter(values["python"]))
    num_proc: int | None = values["num_proc"]
    oversubscribe = bool(values["oversubscribe"])
    hosts = _hosts(values, sources)
    options = backend_values(backends, values, sources.label)
    launcher: str | None = values["launcher"]
    chosen = None if launcher is None else backend.get(launcher)
    if chosen is not None:
        chosen.check_options(hosts, os.environ)
    if hosts is None:
        chosen, found = _found_hosts(chosen, backends, options)
        if found is not None:
            hosts = found.hosts
            num_proc = num_proc or found.num_proc
    launcher = launcher or (chosen.name if chosen is not None else backend.DEFAULT)
    hosts = hosts or (implicit_localhost(num_proc, os.cpu_count() or 1, oversubscribe),)
    refuse_this_machine_twice(hosts, [runs_here(h) for h in hosts])
    plan = build_plan(PlanInputs(hosts, num_proc, oversubscribe))
    ranks = values["ranks"]
    placement = Placement(values["gpus_per_rank"], values["bind_cores"], values["numa_binding"])
    label = sources.label
    config = LaunchConfig(
        command=command,
        hosts=hosts,
        num_proc=plan.world_size,
        master_addr=_word(values["master_addr"], label("master_addr", "--master-addr")),
        master_port=values["master_port"],
        exports=_exports(values, sources),
        env_file=_env_files(values["env_file"]),
        forward_env=values["forward_env"],
        redact=_redact_patterns(values["redact"], label("redact", "--redact")),
        oversubscribe=oversubscribe,
        report=_report_path(values["report"], label("report", "--report")),
        prefix=cast(PrefixMode, values["prefix"]),
        timestamp=values["timestamp"],
        progress_interval=_interval(
            values["progress_interval"], label("progress_interval", "--progress-interval")
        ),
        output_dir=_output_dir(values["output_dir"], label("output_dir", "--output-dir")),
        console_ranks=None if ranks is None else parse_rank_filter(ranks, plan.world_size),
        timeout=None
        if values["timeout"] is None
        else _seconds(values["timeout"], label("timeout", "--timeout")),
        grace_period=_seconds(values["grace_period"], label("grace_period", "--grace-period")),
        stall_timeout=None
        if values["stall_timeout"] is None
        else _seconds(values["stall_timeout"], label("stall_timeout", "--stall-timeout")),
        startup_timeout=_seconds(values["startup_timeout"], label("startup_timeout", "--startup-timeout")),
        stack_tool=values["stack_tool"],
        straggler_window=_seconds(values["straggler_after"], label("straggler_after", "--straggler-after")),
        restart=_restart_options(values, plan.world_size),
        python=_word(values["python"], label("python", "--python")),
        network_interface=_word(
            values["network_interface"], label("network_interface", "--network-interface")
        ),
        gpus_per_rank=placement.gpus_per_rank,
        bind_cores=placement.bind_cores,
        numa_binding=placement.numa_binding,
        color=values["color"],
        backend_options=options,
        launcher=launcher,
        workdir=_workdir(values["workdir"], label("workdir", "--workdir")),
        workdir_limit=values["workdir_limit"] << 20,
        workdir_relay=values["workdir_relay"],
        allow_mismatch=values["allow_mismatch"],
        preflight=bool(values.get("preflight")),
        sample_interval=_interval(values["sample_interval"], label("sample_interval", "--sample-interval")),
    )
    return Request(config=config, dry_run=values["dry_run"], verbose=values["verbose"] or 0)


# Subcommands are the first word only: `distrun -- check` or `./check` still launch a command named check.
_CHECK_EPILOG = """\b
Examples:
  distrun check -H node1:4,node2:4
  distrun check --hostfile hosts.txt --python /opt/venv/bin/python

\b
Exit codes: 0 every host is ready; 3 a host has a problem (each with its fix); 2 bad input.
"""


# A launch's options that say nothing to `distrun check`: its --help leaves them out, and a --config file's
# keys for them are ignored there (one file serves both). `check --perf` measures with the launch's
# environment and writes --report within --timeout: -x, --env-file, --forward-env, --network-interface,
# --report and --timeout apply to it.
_LAUNCH_ONLY = frozenset(
    {
        "command",
        "dry_run",
        "preflight",
        "master_port",
        "redact",
        "prefix",
        "timestamp",
        "output_dir",
        "ranks",
        "stall_timeout",
        "stack_tool",
        "straggler_after",
        "max_restarts",
        "restart_delay",
        "min_np",
        "max_np",
        "host_discovery_script",
        "grace_period",
        "progress_interval",
        "gpus_per_rank",
        "bind_cores",
        "numa_binding",
        "workdir_relay",
        "sample_interval",
    }
)


def check_command(launch: click.Command) -> click.Command:
    """`distrun check` with the options of `launch` that apply to it (the backends' among them)."""

    @click.pass_context
    def check(ctx: click.Context, /, **options: Any) -> int:
        """Check that every host is ready for a launch: SSH, Python and torch, GPUs, the launch directory,
        disk, clock, and TCP to rank 0's host. Takes the launch's host and SSH options; prints a row per
        host."""
        perf = options.pop("perf")
        # The launch's own defaults for what check leaves out (no DISTRUN_* variable read for them).
        with launch.make_context("distrun", ["check"], auto_envvar_prefix=None) as defaults:
            given = {**defaults.params, **options, "command": ("check",)}
        values, sources = merge_config_file(ctx, given, ignore=_LAUNCH_ONLY)
        request = _build_request(values, sources, backends_of(launch))
        _configure_logging(request.verbose)
        from launcher.check.run import run_check

        return run_check(request.config, perf=perf)

    return click.Command(
        name="distrun check",
        callback=check,
        params=[p for p in launch.params if p.name not in _LAUNCH_ONLY]
        + [
            click.Option(
                ["--perf"],
                is_flag=True,
                help="Also measure every host and link (compute, GPUs, bandwidth, latency); name outliers.",
            )
        ],
        context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": ENV_PREFIX},
        epilog=_CHECK_EPILOG,
        help=check.__doc__,
    )


check_cli = check_command(cli)


@click.command(
    name="distrun ssh-setup",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nExample:\n  distrun ssh-setup -H node1,node2,alice@node3\n"
    '  echo "$PW" | distrun ssh-setup --hostfile hosts.txt --password-stdin',
)
@click.option("-H", "--hosts", metavar="HOST,...", help="Hosts, as for a launch (slots are ignored).")
@click.option("--hostfile", metavar="PATH", help="Hostfile, as for a launch.")
@click.option("--ssh-port", type=_PORT, help="SSH port [default: ~/.ssh/config, else 22].")
@click.option(
    "-i",
    "--ssh-identity-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Key to install [default: ~/.ssh/id_ed25519 (created if you have no key), id_ecdsa, id_rsa].",
)
@click.option(
    "--host-key-policy",
    type=click.Choice(["strict", "accept-new", "ignore"]),
    help="Unknown host keys [default: accept-new, recorded in known_hosts].",
)
@click.option("--ssh-connect-timeout", type=float, metavar="SECONDS", default=10.0, show_default=True)
@click.option(
    "--password-stdin", is_flag=True, help="Read the password from standard input, not the terminal."
)
@click.option("-v", "--verbose", count=True, help="Say more (-vv: SSH details).")
def ssh_setup_cli(**options: Any) -> int:
    """Make passwordless SSH work on every host: create a key if needed, record host keys, install the
    public key (asking for the password once) and verify key login. Running it again changes nothing."""
    from launcher.backends.ssh.setup import ask_password, ensure_key, setup_hosts

    _configure_logging(options["verbose"])
    hosts = _hosts(options, Sources({"hosts": 3, "hostfile": 3}, {}, {}, {}))
    if not hosts:
        raise UsageError("ssh-setup: which hosts? give -H or --hostfile")
    ssh = SshOptions(
        port=options["ssh_port"],
        identity_files=(options["ssh_identity_file"],) if options["ssh_identity_file"] else (),
        host_key_policy=cast("HostKeyPolicy | None", options["host_key_policy"]),
        connect_timeout=_seconds(options["ssh_connect_timeout"], "--ssh-connect-timeout"),
    )
    key = ensure_key(ssh.identity_files)
    if key.created:
        click.echo(f"created the key {key.path} (ed25519, no passphrase) and {key.path}.pub")
    results = setup_hosts(hosts, ssh, key, functools.partial(ask_password, options["password_stdin"]))
    for result in results:
        click.echo(result.detail, err=result.state == "failed")
    failed = [r.host for r in results if r.state == "failed"]
    if failed:
        raise HostError(f"ssh-setup failed on {plural(len(failed), 'host', 'hosts')}: {', '.join(failed)}")
    installed = sum(r.state == "installed" for r in results)
    click.echo(f"ssh-setup: key login works on {plural(len(results), 'host', 'hosts')} ({installed} changed)")
    return EXIT_OK


@click.command(
    name="distrun stacks",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nExit codes: 0 shown; 1 no such running job; 2 several jobs run (name one) or bad input.",
)
@click.argument("pid", type=click.IntRange(min=1), required=False)
@click.option(
    "--wait", type=float, default=30.0, show_default=True, metavar="SECONDS", help="Give up after SECONDS."
)
def stacks_cli(pid: int | None, wait: float) -> int:
    """Show every rank's stacks of your running distrun job (PID: which one, when several run), grouped:
    ranks with the same stacks together, the fewest first, and a verdict. The job goes on untouched."""
    from launcher.runtime.control import ask_stacks

    click.echo(ask_stacks(pid, _seconds(wait, "--wait")), nl=False)
    return EXIT_OK


def _launch_command(argv: Sequence[str]) -> click.Command:
    """`cli`, or `cli` with the options of a backend from an installed package that `--launcher` names."""
    name = named_launcher(argv, cli.params, os.environ)
    return cli if name is None else with_backend(cli, name)


def _parse(argv: Sequence[str]) -> Request | int:
    """The request, or the exit code when click already answered (--help, --version)."""
    try:
        if argv and argv[0] in _SUBCOMMANDS:
            command = _SUBCOMMANDS[argv[0]]
            if command is check_cli:
                command = check_command(_launch_command(argv[1:]))
            with command.make_context(f"distrun {argv[0]}", list(argv[1:])) as ctx:
                return cast(int, command.invoke(ctx))
        launch = _launch_command(argv)
        with launch.make_context("distrun", list(argv)) as ctx:
            return cast(Request, launch.invoke(ctx))
    except click.exceptions.Exit as done:
        return done.exit_code


_SUBCOMMANDS: dict[str, click.Command] = {
    "ssh-setup": ssh_setup_cli,
    "check": check_cli,
    "stacks": stacks_cli,
    "top": top_cli,
    "plot": plot_cli,
}


def _run(argv: Sequence[str]) -> int:
    try:
        # From here a Ctrl-C is a KeyboardInterrupt this function answers (until then launcher/__init__.py's
        # guard does, with the same line).
        release_start_guard()
        SCRUBBER.learn(os.environ)
        request = _parse(argv)
        if isinstance(request, int):
            return request
        config = request.config
        SCRUBBER.learn(os.environ, config.redact)
        SCRUBBER.learn((*config.env_file, *config.exports), config.redact)
        _configure_logging(request.verbose)
        for line in unknown_settings(os.environ, _launch_command(argv).params):
            log.warning("%s", line)
        if request.dry_run:
            from launcher.cli.dry_run import format_dry_run

            click.echo(format_dry_run(request.config, os.environ))
            return EXIT_OK
        with without_gc():
            from launcher.job.run import launch  # the runtime (and paramiko) load only when something starts

        return launch(request.config)
    except DistrunError as err:
        _error(str(err))
        return err.exit_code
    except click.BadParameter as err:
        _error(bad_value_message(err))
        return err.exit_code
    except click.ClickException as err:
        _error(err.format_message())
        return err.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        # Before distrun's signal handling took over (it turns Ctrl-C into a stop of the job): one line.
        _error(str(Interrupted("SIGINT", EXIT_SIGINT)))
        return EXIT_SIGINT


def unknown_settings(environ: Mapping[str, str], params: Sequence[click.Parameter]) -> list[str]:
    """A warning for each DISTRUN_* variable that names no option (a typo would otherwise do nothing).

    The variables distrun gives its own ranks are no settings: a distrun started inside a rank sees them.
    """
    options = {f"{ENV_PREFIX}_{p.name.upper()}" for p in params if isinstance(p, click.Option) and p.name}
    lines = []
    for name in sorted(environ):
        if name.startswith(f"{ENV_PREFIX}_") and name not in options and name not in RANK_VARIABLES:
            # Only when there is a stray variable: these imports cost start-up time.
            import difflib

            from launcher.agent.stackdump import HOOK_VARIABLES
            from launcher.agent.store import CACHE_DIR_VAR

            if name == CACHE_DIR_VAR:  # not an option: the workdir cache of every host (docs/workdir.md)
                continue
            if name in HOOK_VARIABLES:  # what each rank's agent adds for the stack hook
                continue

            close = difflib.get_close_matches(name, options, n=1, cutoff=0.85)
            hint = f" (did you mean {close[0]}?)" if close else ""
            lines.append(f"{name} names no option of distrun and is ignored{hint}")
    return lines


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(format="distrun: %(message)s", level=level, stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        if SCRUBBER not in handler.filters:
            handler.addFilter(SCRUBBER)


def _error(message: str) -> None:
    click.echo(f"distrun: error: {SCRUBBER(' '.join(message.splitlines()))}", err=True)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Parse, launch, exit with the job's exit code (SystemExit, so a caller in-process gets it back)."""
    guard_std_fds()
    sys.exit(_run(sys.argv[1:] if argv is None else argv))


def entry() -> NoReturn:
    """The `distrun` command: `main`, then an exit that skips the interpreter's teardown.

    By then every agent has exited and every stream is flushed here; freeing the few hundred modules a launch
    imported was 10-15 ms of a no-op job's start-to-exit, for nothing.
    """
    guard_std_fds()
    code = _run(sys.argv[1:])
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed console: nothing left to say on it
            stream.flush()
    os._exit(code)
