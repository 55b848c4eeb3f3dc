"""The `distrun` command line: the launch's command, the dispatch to a subcommand, and the end of every
start: a launch, a dry run, or an exit code with its one line `distrun: error: ...`.

Errors only become exit codes and that line here, in `_run`. The launch's options are
launcher/cli/launch_options.py, their validation launcher/cli/request.py, the config file's layering
launcher/cli/config_file.py, the other subcommands launcher/cli/subcommands.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, cast

import click

from launcher import release_start_guard, without_gc
from launcher.agent import dataclass_code
from launcher.cli.backend_options import backends_of, named_launcher, with_backend
from launcher.cli.config_file import bad_value_message, merge_config_file
from launcher.cli.horovodrun import (
    expand_abbreviations,
    flags_of_settings,
    horovodrun_options,
    notes,
    translate,
)
from launcher.cli.launch_options import ENV_PREFIX, EPILOG, launch_options
from launcher.cli.request import Request, build_request
from launcher.cli.verbosity import configure_logging
from launcher.console.writer import guard_std_fds
from launcher.core.env import CONTRACT_NAMES, OWN_GPUS_VAR
from launcher.core.envsize import oversized_lines
from launcher.core.scrub import SCRUBBER
from launcher.errors import EXIT_OK, EXIT_SIGINT, DistrunError, Interrupted

# What distrun sets in each rank's environment, not settings of distrun (see launcher/core/env.py).
RANK_VARIABLES = frozenset({*(n for n in CONTRACT_NAMES if n.startswith(f"{ENV_PREFIX}_")), OWN_GPUS_VAR})
# The first word only: `distrun -- check` or `./check` still launch a command named check.
SUBCOMMANDS = ("ssh-setup", "check", "stacks", "top", "plot")
# How alike an unknown option must be to one of ours for a "Did you mean": at click's 0.6, horovodrun's
# --gloo, --nics and --reset-limit were offered --color, --ranks and --workdir-limit.
SUGGEST_CUTOFF = 0.8
log = logging.getLogger(__name__)


@click.command(
    name="distrun",
    context_settings={
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
        "auto_envvar_prefix": ENV_PREFIX,
    },
    epilog=EPILOG,
)
@launch_options
@horovodrun_options
@click.pass_context
def cli(ctx: click.Context, /, **options: Any) -> Request:
    """Run COMMAND as one rank per slot on every host, with the torch/Horovod/TF environment set."""
    if options.get("horovodrun_check_build"):
        # horovodrun prints the build and exits, whatever else its command line says.
        from launcher.cli.check_build import build_report
        from launcher.core.command import interpreter

        click.echo(build_report(interpreter(options.get("python"))))
        raise click.exceptions.Exit(EXIT_OK)
    options, said = translate(ctx, options)
    values, sources = merge_config_file(ctx, options)
    request = build_request(values, sources, backends_of(ctx.command))
    config = request.config
    # A HOROVOD_* variable asks what its horovodrun flag asks, wherever the ranks' environment gets it from.
    settings = {**os.environ, **dict(config.env_file), **dict(config.exports)}
    for line in notes((*said, *flags_of_settings(settings))):
        click.echo(line, err=True)
    return request


def _launch_command(argv: Sequence[str]) -> click.Command:
    """`cli`, or `cli` with the options of a backend from an installed package that `--launcher` names."""
    name = named_launcher(argv, cli.params, os.environ)
    return cli if name is None else with_backend(cli, name)


def _subcommand(name: str, args: Sequence[str]) -> click.Command:
    """The subcommand `name` (of SUBCOMMANDS); check with the options of the launch its `args` would make."""
    from launcher.cli import subcommands  # a launch never needs them

    if name == "check":
        return subcommands.check_command(_launch_command(args))
    if name == "top":
        from launcher.cli.top import top_cli

        return top_cli
    if name == "plot":
        from launcher.cli.plot import plot_cli

        return plot_cli
    return subcommands.ssh_setup_cli if name == "ssh-setup" else subcommands.stacks_cli


def _parse(argv: Sequence[str]) -> Request | int:
    """The request, or the exit code when click already answered (--help, --version)."""
    try:
        if argv and argv[0] in SUBCOMMANDS:
            command = _subcommand(argv[0], argv[1:])
            with command.make_context(f"distrun {argv[0]}", list(argv[1:])) as ctx:
                return cast(int, command.invoke(ctx))
        launch = _launch_command(argv)
        with launch.make_context("distrun", expand_abbreviations(argv, launch.params)) as ctx:
            return cast(Request, launch.invoke(ctx))
    except click.exceptions.Exit as done:
        return done.exit_code


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
        configure_logging(request.verbose)
        for line in unknown_settings(os.environ, _launch_command(argv).params):
            log.warning("%s", line)
        if config.forward_env:
            for line in oversized_lines(os.environ):
                log.warning("%s", line)
        if request.dry_run:
            from launcher.cli.dry_run import format_dry_run

            click.echo(format_dry_run(request.config, os.environ))
            return EXIT_OK
        with without_gc():
            from launcher.job.launch import (
                launch,  # the runtime (and paramiko) load only when something starts
            )

        return launch(request.config)
    except DistrunError as err:
        _error(str(err))
        return err.exit_code
    except click.NoSuchOption as err:
        _error(_no_such_option(err))
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


def _no_such_option(err: click.NoSuchOption) -> str:
    """click's line for an option distrun does not have, with its "Did you mean" only for a near typo
    (--hostfle, --dry_run): a flag of another launcher is no typo of ours."""
    import difflib  # only on this error: it costs start-up time

    # horovodrun's spellings are hidden options: a typo of ours is never pointed at one of them.
    hidden = (
        {name for p in err.ctx.command.params if getattr(p, "hidden", False) for name in p.opts}
        if err.ctx
        else set()
    )
    possibilities = [name for name in err.possibilities or () if name not in hidden]
    close = difflib.get_close_matches(err.option_name, possibilities, n=3, cutoff=SUGGEST_CUTOFF)
    # Our own words, not click's: its wording changed between the releases our range allows (8.1: "No such
    # option: --x").
    line = f"No such option '{err.option_name}'."
    if len(close) == 1:
        return f"{line} Did you mean '{close[0]}'?"
    return f"{line} (Possible options: {', '.join(sorted(close))})" if close else line


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

            from launcher.agent.cache_root import CACHE_DIR_VAR
            from launcher.agent.rankhook import HOOK_VARIABLES

            if name == CACHE_DIR_VAR:  # not an option: the workdir cache of every host (docs/workdir.md)
                continue
            if name in HOOK_VARIABLES:  # what each rank's agent adds for the stack hook
                continue

            close = difflib.get_close_matches(name, options, n=1, cutoff=0.85)
            hint = f" (did you mean {close[0]}?)" if close else ""
            lines.append(f"{name} names no option of distrun and is ignored{hint}")
    return lines


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
    dataclass_code.save()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed console: nothing left to say on it
            stream.flush()
    os._exit(code)
