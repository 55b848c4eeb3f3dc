"""distrun's subcommands besides the launch: `check` (is every host ready?), `ssh-setup` (passwordless SSH
to every host) and `stacks` (every rank's stacks of a running job).

Each is the first word of the command line only: `distrun -- check` or `./check` still launch a command named
check (launcher/cli/main.py dispatches). Check's output is launcher/check/run.py's, ssh-setup's prompt
launcher/backends/ssh/setup.py's.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

import click

from launcher.backends.ssh.options import HostKeyPolicy, SshOptions
from launcher.cli.backend_options import backends_of
from launcher.cli.config_file import Sources, merge_config_file
from launcher.cli.launch_options import ENV_PREFIX, PORT
from launcher.cli.request import build_request, given_hosts, positive_seconds
from launcher.cli.verbosity import configure_logging
from launcher.core.plan import plural
from launcher.errors import EXIT_OK, HostError, UsageError

CHECK_EPILOG = """\b
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
LAUNCH_ONLY = frozenset(
    {
        "command",
        "dry_run",
        "preflight",
        "sample_interval",
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
        "reset_limit",
        "host_discovery_script",
        "slots_per_host",
        "grace_period",
        "progress_interval",
        "gpus_per_rank",
        "bind_cores",
        "numa_binding",
        "workdir_relay",
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
        values, sources = merge_config_file(ctx, given, ignore=LAUNCH_ONLY)
        request = build_request(values, sources, backends_of(launch))
        configure_logging(request.verbose)
        from launcher.check.run import run_check

        return run_check(request.config, perf=perf)

    return click.Command(
        name="distrun check",
        callback=check,
        params=[p for p in launch.params if p.name not in LAUNCH_ONLY]
        + [
            click.Option(
                ["--perf"],
                is_flag=True,
                help="Also measure every host and link (compute, GPUs, bandwidth, latency); name outliers.",
            )
        ],
        context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": ENV_PREFIX},
        epilog=CHECK_EPILOG,
        help=check.__doc__,
    )


@click.command(
    name="distrun ssh-setup",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nExample:\n  distrun ssh-setup -H node1,node2,alice@node3\n"
    '  echo "$PW" | distrun ssh-setup --hostfile hosts.txt --password-stdin',
)
@click.option("-H", "--hosts", metavar="HOST,...", help="Hosts, as for a launch (slots are ignored).")
@click.option("--hostfile", metavar="PATH", help="Hostfile, as for a launch.")
@click.option("--ssh-port", type=PORT, help="SSH port [default: ~/.ssh/config, else 22].")
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

    configure_logging(options["verbose"])
    hosts = given_hosts(options, Sources({"hosts": 3, "hostfile": 3}, {}, {}, {}))
    if not hosts:
        raise UsageError("ssh-setup: which hosts? give -H or --hostfile")
    ssh = SshOptions(
        port=options["ssh_port"],
        identity_files=(options["ssh_identity_file"],) if options["ssh_identity_file"] else (),
        host_key_policy=cast("HostKeyPolicy | None", options["host_key_policy"]),
        connect_timeout=positive_seconds(options["ssh_connect_timeout"], "--ssh-connect-timeout"),
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

    click.echo(ask_stacks(pid, positive_seconds(wait, "--wait")), nl=False)
    return EXIT_OK
