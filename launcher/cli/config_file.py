"""Option values and where each came from: command line > DISTRUN_* environment > --config YAML > defaults.

`merge_config_file` fills the options a click command left at their defaults from the YAML file (paths in it
relative to the file; repeatable options add up, the file's first) and says each option's precedence level,
which decides between -H and --hostfile and names the source in messages.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from launcher.errors import UsageError

# Where a value came from, for "CLI > DISTRUN_* env > config file > defaults".
_CONFIG_LEVEL = 1
ENV_LEVEL = 2  # a DISTRUN_* variable


_SOURCES = "distrun.sources"  # ctx.meta's key for what SourcedOption records


class SourcedOption(click.Option):
    """An option that records where its value came from as soon as it is read, before its type converts it.

    click's own record (ctx.get_parameter_source) is made after the conversion in some releases (8.4.0), so
    a DISTRUN_* value that fails to convert would be named as the command line's option.
    """

    def consume_value(
        self, ctx: click.Context, opts: Mapping[str, click.Parameter]
    ) -> tuple[Any, ParameterSource]:
        value, source = super().consume_value(ctx, opts)
        if self.name:
            ctx.meta.setdefault(_SOURCES, {})[self.name] = source
        return value, source


def parameter_source(ctx: click.Context, name: str) -> ParameterSource | None:
    """Where option `name`'s value came from: as SourcedOption recorded it, else as click did."""
    recorded: ParameterSource | None = ctx.meta.get(_SOURCES, {}).get(name)
    return recorded if recorded is not None else ctx.get_parameter_source(name)


def _level(source: ParameterSource | None) -> int:
    if source is ParameterSource.COMMANDLINE:
        return 3
    return ENV_LEVEL if source is ParameterSource.ENVIRONMENT else 0


def env_name(ctx: click.Context, name: str) -> str:
    """The DISTRUN_* variable of option `name`, as click reads it."""
    return f"{ctx.auto_envvar_prefix or 'DISTRUN'}_{name.upper()}"


def option_name(param: click.Parameter) -> str:
    """An option as a user types it: `-np/--num-proc`."""
    return "/".join(param.opts) if param.opts else str(param.name)


_BOOLEAN = " is not a valid boolean"


def value_problem(err: click.BadParameter) -> str:
    """click's words for a bad value, where they mislead: a boolean's list of accepted values begins with an
    empty one, and a number with bounds "is not a valid integer range"."""
    message = err.message
    if _BOOLEAN in message:
        shown = message.partition(_BOOLEAN)[0]
        return f"{shown}{_BOOLEAN}; expected true or false (also 1/0, yes/no, on/off)"
    for kind in ("integer", "float"):
        message = message.replace(f"is not a valid {kind} range", f"is not a valid {kind}")
    return message


def bad_value_message(err: click.BadParameter) -> str:
    """The one line for a bad option value, naming where it came from: the command line's option as click
    names it, or the DISTRUN_* variable that set it together with its option."""
    ctx, param = err.ctx, err.param
    problem = value_problem(err)
    name = param.name if param is not None else None
    if (
        ctx is not None
        and param is not None
        and name
        and parameter_source(ctx, name) is ParameterSource.ENVIRONMENT
    ):
        return f"Invalid value for {env_name(ctx, name)} ({option_name(param)}): {problem}"
    return click.BadParameter(problem, ctx, param, err.param_hint).format_message()


def _config_params(ctx: click.Context) -> dict[str, click.Parameter]:
    return {
        p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name and p.expose_value
    }


# Options naming files: in a config file they are relative to the file, not to where distrun runs.
# (Options of type click.Path, a backend's files among them, are such too.)
_PATH_OPTIONS = frozenset({"hostfile", "output_dir", "env_file", "report", "workdir"})


@dataclass(frozen=True)
class ConfigValue:
    """A key's value as YAML reads it, its line, and its text as written (per item for a list)."""

    value: Any
    line: int
    written: tuple[str, ...] = ()


def load_config_file(path: str) -> dict[str, ConfigValue]:
    """Each top-level key with its value and line; a top-level key given twice is an error."""
    import yaml  # only config-file users pay for importing yaml

    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "it is not UTF-8 text"
        raise UsageError(f"cannot read config file {path}: {reason}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise UsageError(f"{where}: not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(root, yaml.MappingNode):
        raise UsageError(f"config file {path}: expected a mapping of option names to values")
    lines: dict[str, int] = {}
    written: dict[str, list[str]] = {}
    for key_node, value_node in root.value:
        key, line = str(key_node.value), key_node.start_mark.line + 1
        # YAML keeps the last of two equal keys without a word; one of them is surely a mistake.
        if key in lines:
            raise UsageError(f"{path}:{line}: {key!r} is already set at line {lines[key]}")
        lines[key] = line
        written[key] = _as_written(value_node)
    return {
        str(key): ConfigValue(value, lines.get(str(key), 1), tuple(written.get(str(key), ())))
        for key, value in data.items()
    }


def _as_written(node: Any) -> list[str]:
    """A value's text as the file has it (`yes`, not the True YAML reads it as): a list's, item by item."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return [str(item.value) if isinstance(item, yaml.ScalarNode) else "..." for item in node.value]
    return [str(node.value)] if isinstance(node, yaml.ScalarNode) else []


def _config_value(param: click.Parameter, given: ConfigValue, base: Path, label: str) -> Any:
    """A config file value in the form click would have parsed from the command line."""
    value = given.value
    if param.name == "hosts" and isinstance(value, list):
        value = ",".join(str(item) for item in value)
    if param.multiple and not isinstance(value, list):
        value = [value]
    elif not param.multiple and isinstance(value, (list, dict)):
        raise UsageError(f"{label} takes a single value")
    items = value if param.multiple else [value]
    if isinstance(param.type, click.types.IntParamType):
        for index, item in enumerate(items):
            if isinstance(item, (bool, float)):
                # click would truncate 2.7 to 2 silently.
                text = given.written[index] if index < len(given.written) else str(item)
                raise UsageError(f"{label}: expected a whole number, got {text}")
    if param.name in _PATH_OPTIONS or isinstance(param.type, click.Path):
        items = [str(base / Path(str(item)).expanduser()) for item in items]
        value = items if param.multiple else items[0]
    return value


@dataclass
class Sources:
    """Where each option's value came from: its precedence level and the name to use in messages."""

    levels: dict[str, int]
    labels: dict[str, str]
    file_counts: dict[str, int]  # of a repeatable option's values, how many came first from the file
    file_labels: dict[str, str]  # and the name of the file's part in messages

    def label(self, name: str, flag: str) -> str:
        return self.labels.get(name, flag)


def merge_config_file(
    ctx: click.Context, options: dict[str, Any], ignore: Collection[str] = ()
) -> tuple[dict[str, Any], Sources]:
    """Fill options still at their defaults from the --config file; report each option's precedence level.

    Repeatable options add up instead: the file's `export` list comes first, then -x on the command line.
    Keys naming an option in `ignore` (another command's, of a file both read) are passed over.
    """
    values = dict(options)
    sources = Sources({name: _level(parameter_source(ctx, name)) for name in options}, {}, {}, {})
    # A value from the environment is named as the user set it, with the option it sets:
    # `DISTRUN_TIMEOUT (--timeout)`, not `--timeout`.
    by_name = {p.name: p for p in ctx.command.params if p.name}
    sources.labels.update(
        (name, f"{env_name(ctx, name)} ({option_name(by_name[name])})")
        for name, level in sources.levels.items()
        if level == ENV_LEVEL and name in by_name
    )
    path = options["config"]
    if path is None:
        return values, sources
    params = _config_params(ctx)
    params.pop("config")
    base = Path(path).expanduser().parent
    seen: dict[str, str] = {}
    for key, given in load_config_file(path).items():
        raw, line = given.value, given.line
        name = key.replace("-", "_")
        label = f"{path}:{line}: {key}"
        if name in ignore and name not in params:
            continue
        if name not in params:
            raise UsageError(f"{path}:{line}: unknown option {key!r}")
        if name in seen:
            raise UsageError(f"{path}:{line}: {seen[name]!r} and {key!r} set the same option")
        seen[name] = key
        param = params[name]
        if raw is None or (sources.levels[name] > 0 and not param.multiple):
            continue
        try:
            value = param.type_cast_value(ctx, _config_value(param, given, base, label))
        except click.BadParameter as err:
            raise UsageError(f"{label}: {value_problem(err)}") from None
        if sources.levels[name] > 0:
            sources.file_counts[name] = len(value)
            sources.file_labels[name] = label
            values[name] = (*value, *values[name])
            continue
        values[name] = value
        sources.levels[name] = _CONFIG_LEVEL
        sources.labels[name] = label
    return values, sources
