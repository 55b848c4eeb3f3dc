"""Backends' own options on the command line: each `BackendOption` made a click option, the values handed
back to the backend that declared it, and the `--launcher` named before parsing, for a backend from an
installed package whose options must be known to parse the rest."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from launcher.backends import api
from launcher.backends.api import Backend
from launcher.backends.options import BackendOption
from launcher.cli.config_file import SourcedOption
from launcher.errors import UsageError

_F = TypeVar("_F", bound=Callable[..., Any])
LAUNCHER_ENV = "DISTRUN_LAUNCHER"
CONFIG_ENV = "DISTRUN_CONFIG"


def _spec(option: BackendOption) -> tuple[list[str], dict[str, Any]]:
    decls = [option.flag] if option.short is None else [option.short, option.flag]
    kwargs: dict[str, Any] = {
        "help": option.help or None,
        "show_envvar": True,
        "show_default": option.show_default,
        "multiple": option.multiple,
        "metavar": option.metavar,
        "default": option.default,
    }
    if option.type is bool:
        kwargs.update(is_flag=True, default=bool(option.default))
    elif option.choices:
        kwargs["type"] = click.Choice(list(option.choices))
    elif option.type is Path:
        kwargs["type"] = click.Path(exists=option.must_exist, dir_okay=False, path_type=Path)
    elif option.type is int and (option.minimum is not None or option.maximum is not None):
        kwargs["type"] = click.IntRange(option.minimum, option.maximum)
    else:
        kwargs["type"] = option.type
    return decls, kwargs


def click_option(option: BackendOption) -> click.Option:
    decls, kwargs = _spec(option)
    return SourcedOption(decls, **kwargs)


def declared(backends: Sequence[Backend]) -> Callable[[_F], _F]:
    """A decorator adding every option these backends declare, in their order, where it stands."""

    def add(function: _F) -> _F:
        # Decorators apply from the bottom up: the last option first keeps the declared order.
        for backend in reversed(backends):
            for option in reversed(backend.options):
                decls, kwargs = _spec(option)
                function = click.option(*decls, cls=SourcedOption, **kwargs)(function)
        return function

    return add


def backend_values(
    backends: Sequence[Backend], values: Mapping[str, Any], label: Callable[[str, str], str]
) -> dict[str, object]:
    """Backend name -> its options' validated value, for each backend that declares options."""
    return {
        backend.name: backend.parse_options(
            {option.key: values[option.key] for option in backend.options},
            lambda key: label(key, "--" + key.replace("_", "-")),
        )
        for backend in backends
        if backend.options
    }


def _given(argv: Sequence[str], params: Sequence[click.Parameter], flag: str) -> str | None:
    """`flag`'s value before COMMAND, read the way click will: options that take a value skip it, and the
    first word that is no option is the command."""
    takes_value = {
        opt for p in params if isinstance(p, click.Option) and not p.is_flag and not p.count for opt in p.opts
    }
    value = None
    words = iter(argv)
    for word in words:
        if word == "--" or not word.startswith("-"):
            break
        if word.startswith(f"{flag}="):
            value = word.partition("=")[2]
        elif word == flag:
            value = next(words, None)
        elif word in takes_value:
            next(words, None)
    return value


def named_launcher(
    argv: Sequence[str], params: Sequence[click.Parameter], environ: Mapping[str, str]
) -> str | None:
    """The `--launcher` a command line will have, known before parsing it: the command line's, else
    DISTRUN_LAUNCHER, else the --config file's (DISTRUN_CONFIG's) `launcher` key."""
    name = _given(argv, params, "--launcher") or environ.get(LAUNCHER_ENV)
    if name:
        return name
    config = _given(argv, params, "--config") or environ.get(CONFIG_ENV)
    if not config:
        return None
    from launcher.cli.config_file import load_config_file

    try:
        given = load_config_file(config).get("launcher")
    except UsageError:  # said where click would say it, after --help and the command line's own errors
        return None
    return str(given.value) if given is not None and given.value else None


def backends_of(command: click.Command) -> tuple[Backend, ...]:
    """The backends `command` has the options of: its `--launcher` choices."""
    return tuple(api.get(name) for name in _launcher(command).type.choices)  # type: ignore[attr-defined]


def _launcher(command: click.Command) -> click.Parameter:
    return next(p for p in command.params if p.name == "launcher")


def with_backend(command: click.Command, name: str) -> click.Command:
    """`command` with the options of the backend `name` (registered, or from an installed package's entry
    point), which `--launcher` then accepts. `command` itself when it has them already, or when no backend
    has that name (click then says which names there are)."""
    launcher = _launcher(command)
    if name in launcher.type.choices:  # type: ignore[attr-defined]
        return command
    try:
        backend = api.get(name)
    except KeyError:
        return command
    taken = {opt for p in command.params for opt in p.opts}
    new = [click_option(option) for option in backend.options]
    for option in new:
        clash = taken.intersection(option.opts)
        if clash:
            raise UsageError(f"--launcher {name}: its option {min(clash)} is already an option of distrun")
    choice = copy.copy(launcher)
    choice.type = click.Choice([*launcher.type.choices, name])  # type: ignore[attr-defined]
    extended = copy.copy(command)
    extended.params = []
    for param in command.params:
        if param is launcher:
            extended.params.extend([*new, choice])
        else:
            extended.params.append(param)
    return extended
