"""Run the user's `--host-discovery-script` and read the hosts it prints (`host[:slots]` per line)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from launcher.core.hosts import Host, parse_host_entry
from launcher.errors import UsageError

TIMEOUT = 30.0


class DiscoveryError(UsageError):
    """The discovery script failed or printed something that is not a host."""


def parse_discovery_output(text: str, script: Path) -> tuple[Host, ...]:
    """Blank lines and `#` comments are skipped; a host listed twice is kept once (the first)."""
    hosts: dict[str, Host] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            host = parse_host_entry(line, f"{script}:{number}")
        except ValueError as err:
            raise DiscoveryError(f"{script} output line {number} {line!r}: {err}") from None
        hosts.setdefault(host.name, host)
    return tuple(hosts.values())


def discover(script: Path, timeout: float = TIMEOUT) -> tuple[Host, ...]:
    """The hosts the script lists now. Its argv is the path alone: nothing passes through a shell.

    It runs in a process group of its own, so that when it overruns `timeout` the whole group goes (a `sleep`
    it started, a pipeline), not only the script, and nothing of it keeps running or holds its pipes.
    """
    try:
        proc = subprocess.Popen(
            [str(script)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        reason = err.strerror or err
        raise DiscoveryError(f"--host-discovery-script {script}: cannot run it: {reason}") from None
    try:
        out, err_out = proc.communicate(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()  # reaps it; its pipes closed with the group
        raise DiscoveryError(
            f"--host-discovery-script {script}: no answer within {timeout:.3g}s; "
            "stopped it and what it started"
        ) from None
    _kill_group(proc)  # what it left running in its group (a background `sleep &`)
    if proc.returncode != 0:
        said = err_out.decode(errors="replace").strip().splitlines()
        detail = f": {said[-1]}" if said else ""
        raise DiscoveryError(f"--host-discovery-script {script} exited with code {proc.returncode}{detail}")
    return parse_discovery_output(out.decode(errors="replace"), script)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
