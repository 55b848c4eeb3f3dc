"""Run the user's `--host-discovery-script` and read the hosts it prints (`host[:slots]` per line)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launcher.errors import UsageError
from launcher.hosts import Host, parse_host_entry

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


def discover(script: Path) -> tuple[Host, ...]:
    """The hosts the script lists now. Its argv is the path alone: nothing passes through a shell."""
    try:
        done = subprocess.run([str(script)], capture_output=True, timeout=TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DiscoveryError(f"--host-discovery-script {script}: {err}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        detail = f": {said[-1]}" if said else ""
        raise DiscoveryError(f"--host-discovery-script {script} exited with code {done.returncode}{detail}")
    return parse_discovery_output(done.stdout.decode(errors="replace"), script)
