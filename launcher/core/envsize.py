"""The kernel's limit on one environment string, checked before anything starts.

execve(2) refuses a process whose argument or environment strings include one longer than MAX_ARG_STRLEN
(32 pages: 131072 bytes with 4 KiB pages, its NUL included) with E2BIG, which the rank's start then reports
as "Argument list too long" without naming the variable. 4 KiB pages give the smallest limit of any host.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.errors import UsageError

MAX_ARG_STRLEN = 32 * 4096


def entry_size(name: str, value: str) -> int:
    """The bytes `NAME=VALUE` takes in a process's environment, its NUL included."""
    return len(f"{name}={value}".encode("utf-8", "surrogateescape")) + 1


def over_limit(name: str, value: str) -> bool:
    return entry_size(name, value) > MAX_ARG_STRLEN


def _said(name: str, value: str) -> str:
    return (
        f"is {entry_size(name, value) - 1} bytes as {name}=VALUE, over the kernel's limit of "
        f"{MAX_ARG_STRLEN - 1} for one environment variable (MAX_ARG_STRLEN)"
    )


def check_size(name: str, value: str, where: str) -> None:
    """UsageError naming `where` (`-x`, `FILE:LINE:`) and the variable, never the value, when no process can
    be given it."""
    if over_limit(name, value):
        raise UsageError(f"{where} {name}: {_said(name, value)}; pass so large a value in a file")


def oversized_lines(environ: Mapping[str, str]) -> list[str]:
    """A warning for each variable of this shell no rank can be given (a launch is not refused for a
    variable it may not even use): it is left out of every rank's environment."""
    return [
        f"{name} {_said(name, value)}; it is not given to the ranks"
        for name, value in sorted(environ.items())
        if over_limit(name, value)
    ]
