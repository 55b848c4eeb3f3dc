"""A launch's command-line options, as data: each option's declaration in --help's order, and its epilog.

Every option is also a DISTRUN_<OPTION> variable and a key of the --config file (launcher/cli/config_file.py);
their values are validated into a `LaunchConfig` by launcher/cli/request.py. `distrun check` takes the same
declarations, less those that say nothing to it (launcher/cli/subcommands.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from launcher import __version__
from launcher.backends import api as backend
from launcher.cli.backend_options import declared
from launcher.cli.config_file import SourcedOption

_F = TypeVar("_F", bound=Callable[..., Any])
ENV_PREFIX = "DISTRUN"

EPILOG = """\b
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
horovodrun's flags are accepted too (-p, --start-timeout, --fusion-threshold-mb, --mpi-args, ...), hidden
here: what each does is in docs/usage.md ("horovodrun's flags").

\b
Exit codes: 0 every rank succeeded; 2 bad input; 3 a host unreachable, failing preflight or lost;
124 --timeout expired; 130/143/129/131 SIGINT/SIGTERM/SIGHUP/SIGQUIT; 126/127 the command cannot run / is
not found; 3 also when an elastic job falls below --min-np; 4 every rank succeeded but --report could not be
written; otherwise the first failing rank's exit code (128+N for signal N).
"""


option = functools.partial(click.option, show_envvar=True, cls=SourcedOption)
PORT = click.IntRange(1, 65535)

# Each a decorator adding one option (or the backends' options, or COMMAND), in --help's order.
OPTIONS: tuple[Callable[[Any], Any], ...] = (
    option(
        "-np", "--num-proc", type=click.IntRange(min=1), help="Number of processes [default: every slot]."
    ),
    option("-H", "--hosts", metavar="HOST[:SLOTS],...", help="Hosts: a:4,user@b:4,[fe80::1]:2."),
    option("--hostfile", metavar="PATH", help="OpenMPI-style hostfile: 'host slots=N [max_slots=M]' lines."),
    option("--master-addr", metavar="ADDR", help="Address of rank 0's host as every host reaches it."),
    option("--master-port", type=PORT, help="Rendezvous port [default: a free port on rank 0's host]."),
    option(
        "-x", "--export", multiple=True, metavar="VAR[=VALUE]", help="Set VAR for every rank (repeatable)."
    ),
    option("--env-file", multiple=True, metavar="PATH", help="KEY=VALUE lines for every rank (before -x)."),
    option(
        "--forward-env/--no-forward-env",
        default=True,
        show_default=True,
        help="Start every rank from this shell's environment (less a deny-list).",
    ),
    option(
        "--redact", multiple=True, metavar="GLOB", help="Never print values of these variables (repeatable)."
    ),
    option(
        "--report", metavar="FILE.json", help="Write the run's account as JSON (docs/report.schema.json)."
    ),
    option(
        "--oversubscribe",
        is_flag=True,
        help="Allow more ranks than slots (max_slots, or this machine's cores).",
    ),
    option("--prefix", type=click.Choice(["rank", "host", "none"]), default="rank", show_default=True),
    option("--timestamp", is_flag=True, help="Prefix console lines with the time."),
    option("--output-dir", metavar="DIR", help="Also write each rank's raw output to DIR."),
    option("--ranks", metavar="LIST", help="Show only these ranks on the console, e.g. 0,2-3."),
    option(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="Stop the job after SECONDS, showing every rank's stacks (exit 124).",
    ),
    option(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="When no rank has written anything for SECONDS, show every rank's stacks (once per stall).",
    ),
    option(
        "--startup-timeout",
        type=float,
        metavar="SECONDS",
        default=180.0,
        show_default=True,
        help="Give up on a host whose login shell and agent have not started and answered in SECONDS.",
    ),
    option(
        "--stack-tool",
        type=click.Choice(["auto", "py-spy", "python"]),
        default="auto",
        show_default=True,
        help="How ranks' stacks are read: py-spy (native frames too), python (the standard library), auto.",
    ),
    option(
        "--straggler-after",
        type=float,
        metavar="SECONDS",
        default=60.0,
        show_default=True,
        help="Name a rank whose progress bar stays 25% below the median rate this long.",
    ),
    option(
        "--max-restarts",
        type=click.IntRange(min=0),
        metavar="N",
        help="Restart the job up to N times when a rank fails or a host is lost "
        "[default: 0; 3 with --min-np].",
    ),
    option(
        "--restart-delay",
        type=float,
        metavar="SECONDS",
        default=1.0,
        show_default=True,
        help="Pause before a restart.",
    ),
    option(
        "--min-np",
        type=click.IntRange(min=1),
        metavar="N",
        help="Elastic: go on without lost hosts down to N ranks.",
    ),
    option(
        "--max-np", type=click.IntRange(min=1), metavar="N", help="Elastic: at most N ranks [default: -np]."
    ),
    option(
        "--reset-limit",
        type=click.IntRange(min=0),
        metavar="N",
        help="Elastic: at most N resets in place (ranks using hvd.elastic); the next ends the job.",
    ),
    option(
        "--host-discovery-script",
        metavar="PATH",
        help="Elastic: executable printing 'host[:slots]' lines, polled every second; hosts join and leave "
        "at the ranks' next commit (hvd.elastic), else at the next restart.",
    ),
    option(
        "--slots-per-host",
        type=click.IntRange(min=1),
        metavar="N",
        help="Elastic: slots of a discovered host whose line names none [default: 1].",
    ),
    option(
        "--elastic-timeout",
        type=float,
        metavar="SECONDS",
        help="Elastic: wait this long for --min-np slots (a host's cooldown, the discovery script) before "
        "giving up [default: 600].",
    ),
    option(
        "--blacklist-cooldown-range",
        type=(int, int),
        metavar="MIN MAX",
        help="Elastic: a host left out comes back after a cooldown from MIN to MAX seconds, doubling each "
        "time [default: it stays out].",
    ),
    option(
        "--grace-period",
        type=float,
        metavar="SECONDS",
        default=5.0,
        show_default=True,
        help="SIGTERM (Ctrl-C: SIGINT) to SIGKILL delay.",
    ),
    option(
        "--progress-interval",
        type=float,
        metavar="SECONDS",
        default=5.0,
        show_default=True,
        help="Off a terminal, write a rank's progress-bar redraws as lines at most this often "
        "(0: every one).",
    ),
    option(
        "--color/--no-color", default=None, help="Color the prefixes [default: when stdout is a terminal]."
    ),
    option("--python", metavar="PATH", help="Interpreter for *.py commands [default: this one]."),
    option(
        "--network-interface", metavar="IF", help="Interface for gloo/NCCL traffic (sets *_SOCKET_IFNAME)."
    ),
    option(
        "--gpus-per-rank",
        type=click.IntRange(min=1),
        metavar="N",
        help="Give each rank N GPUs of its own (its CUDA_VISIBLE_DEVICES).",
    ),
    option("--bind-cores", is_flag=True, help="Pin each rank to its own share of the host's cores."),
    option(
        "--numa-binding",
        is_flag=True,
        help="Pin each rank to cores of its GPUs' NUMA node (--gpus-per-rank).",
    ),
    declared(backend.table()),
    option(
        "--launcher",
        type=click.Choice(backend.names()),
        help=backend.launcher_help(),
    ),
    option(
        "--workdir",
        metavar="DIR",
        help="Copy DIR to every host's cache (only what a host lacks travels); ranks run in that copy.",
    ),
    option(
        "--workdir-limit",
        type=click.IntRange(min=1),
        metavar="MIB",
        default=200,
        show_default=True,
        help="Refuse a --workdir bigger than this many MiB.",
    ),
    option(
        "--workdir-relay/--no-workdir-relay",
        default=True,
        show_default=True,
        help="Hosts that have the --workdir copy feed the others over TCP (token-checked, not encrypted).",
    ),
    option(
        "--allow-mismatch",
        is_flag=True,
        help="Run even where hosts differ in workdir copy, Python, torch, CUDA or NCCL (warn only).",
    ),
    option(
        "--preflight",
        is_flag=True,
        help="Before any rank starts, measure every host and link as `check --perf` does: an outlier ends a "
        "fixed-size job (exit 3); an elastic one (--min-np) leaves it out.",
    ),
    option(
        "--sample-interval",
        type=float,
        metavar="SECONDS",
        default=2.0,
        show_default=True,
        help="Sample each rank's CPU, memory and GPU this often, for `distrun top` and --report (0: off).",
    ),
    option("--config", metavar="PATH", help="YAML file of option defaults (keys: option names)."),
    option("--dry-run", is_flag=True, help="Print each rank's host and environment; run nothing."),
    option("-v", "--verbose", count=True, help="Say more about what distrun does (-vv: SSH details too)."),
    click.version_option(__version__, "--version", prog_name="distrun", message="%(prog)s %(version)s"),
    click.argument("command", nargs=-1, type=click.UNPROCESSED, required=False),
)


def launch_options(function: _F) -> _F:
    """Every option of a launch and its COMMAND argument, on the click command `function` becomes."""
    # Decorators apply from the bottom up: the last first keeps --help's order.
    for decorator in reversed(OPTIONS):
        function = decorator(function)
    return function
