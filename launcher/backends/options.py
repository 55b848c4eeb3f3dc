"""What a backend declares about its own command-line options, without click: the CLI makes each one a
`--NAME` option, a DISTRUN_NAME variable and a `NAME:` key of the --config file, and hands the values back to
the backend (`Backend.parse_options`), whose validated value travels in `LaunchConfig.backend_options`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OptionType = type[str] | type[int] | type[float] | type[bool] | type[Path]


@dataclass(frozen=True)
class BackendOption:
    """One option: `name` without dashes (`ssh-port`); `type` bool makes a flag, Path a file name (relative to
    the config file there). `minimum` bounds an int; `choices` restricts a str; `multiple` repeats it."""

    name: str
    help: str = ""
    type: OptionType = str
    default: object = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    multiple: bool = False
    short: str | None = None  # another spelling, such as "-i"
    must_exist: bool = False  # a Path that must name an existing file
    show_default: bool = False

    @property
    def key(self) -> str:
        """The name values are found by: what click, the config file and `parse_options` call it."""
        return self.name.replace("-", "_")

    @property
    def flag(self) -> str:
        return f"--{self.name}"
