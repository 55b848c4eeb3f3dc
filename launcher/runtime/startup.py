"""A host's start-up, from its SSH session to its agent's first answer, waited for within --startup-timeout.

Before the agent can start, the host's login shell runs its rc files (pyenv, conda, environment modules): on
a home shared by every host those take one lock per login, and 128 logins then take a minute, one after the
other. Such a host is alive, its machine acknowledging what we send (launcher.backends.ssh.tcp), and is
waited for up to the limit; a host that shows no sign of life is named after the probe's stall time as
before. Giving up names the limit and what the host was doing; the last line its login shell printed is
shown as that, not as the cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.errors import HostError
from launcher.runtime.node import Node


class StartupTimedOut(HostError):
    """A host's agent had not answered within --startup-timeout (exit 3, as for any host that fails)."""


def doing(node: Node, now: float) -> str:
    """What a host that has not answered yet is doing, in words."""
    if node.hello_at is None:
        said = node.login_output()
        text = "its login shell was still running (its agent had not started)"
        return f"{text}; the shell's last line: {said}" if said else text
    return f"its agent had started {now - node.hello_at:.0f}s before but not answered"


@dataclass(frozen=True)
class StartupWatch:
    """The probe's patience with hosts still starting: `limit` seconds from `started`; a host counts as
    alive while it was heard (or its machine acknowledged our bytes) within the last `stall` seconds."""

    limit: float
    started: float
    stall: float

    def left(self, now: float) -> float:
        return self.started + self.limit - now

    def alive(self, node: Node, now: float) -> bool:
        return now - node.last_heard < self.stall

    def give_up(self, node: Node, now: float) -> StartupTimedOut:
        return StartupTimedOut(
            f"host {node.name}: still starting after {self.limit:g}s (--startup-timeout): {doing(node, now)}",
            host=node.name,
        )

    def waiting(self, missing: Sequence[Node], total: int, now: float) -> str:
        """One line for the hosts still starting, each stall period: how many, doing what, until when."""
        login = sum(node.hello_at is None for node in missing)
        parts = [f"{login} in their login shell"] if login else []
        if len(missing) > login:
            parts.append(f"{len(missing) - login} starting their agent")
        first = missing[0]
        return (
            f"waiting for {len(missing)} of {total} hosts still starting after {now - self.started:.0f}s "
            f"({', '.join(parts)}; {first.name}: {doing(first, now)}); "
            f"giving up after {self.limit:g}s (--startup-timeout)"
        )
