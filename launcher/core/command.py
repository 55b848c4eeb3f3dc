"""Turn the user's command into the argv each worker runs (pure)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launcher.errors import UsageError


def interpreter(python_option: str | None, host_has_ours: bool = True) -> str:
    """The interpreter that runs `.py` commands on a host: --python, else this interpreter's path where that
    host has it (the probe asks), else python3."""
    if python_option:
        return python_option
    return sys.executable if host_has_ours else "python3"


def resolve_command(command: Sequence[str], python: str) -> tuple[str, ...]:
    """`train.py --lr 1` runs as `python train.py --lr 1`, so scripts need no shebang or exec bit.

    `python` is the interpreter on the host that runs it: sys.executable locally, the remote one elsewhere.
    """
    if not command:
        raise UsageError("missing command: what should each rank run? e.g. distrun -np 2 python train.py")
    if command[0].endswith(".py"):
        return (python, *command)
    return tuple(command)


def script_of(command: Sequence[str]) -> str | None:
    """The script file a `.py` command runs, checked on every host before anything starts."""
    return command[0] if command and command[0].endswith(".py") else None
