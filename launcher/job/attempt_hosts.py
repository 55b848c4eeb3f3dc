"""An attempt's hosts, owned in one place: the list the Supervisor, the elastic driver, the host watch and the
spawning of newcomers share, and how a host comes into a running attempt (docs/elastic.md).

A host comes in two ways. One the discovery script added is connected, probed the way every host of a launch
is (its software compared with the others', whatever their count) and given the job's files; one that fails
any of that is refused before any reset begins, so it costs none. A host of the attempt whose ranks all ended
(a failed rank's host, left out) comes back after its cooldown on the connection it still has: its agent takes
a new START.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from launcher.core.hosts import Host
from launcher.errors import DistrunError
from launcher.runtime.node import HostAttempt, Node

log = logging.getLogger(__name__)


@dataclass
class AttemptHosts:
    """`everyone`: every host of the attempt in its order (those with ranks, the spares, hosts that came in
    since); `began`: hosts without ranks at the start whose agent has started ranks since. `connect(new)`
    reaches hosts (all or nothing), `admit(joined, everyone)` probes, syncs and compares them with the others
    (DistrunError: refused), `forget(nodes)` closes the connections of hosts refused."""

    everyone: list[HostAttempt]
    connect: Callable[[Sequence[Host]], list[Node]]
    admit: Callable[[Sequence[HostAttempt], Sequence[HostAttempt]], None]
    forget: Callable[[Sequence[Node]], None]
    began: set[str] = field(default_factory=set)
    # Told of each record that comes into the running attempt (a host added, or revived): the Supervisor
    # reads its frames from then on, the elastic driver sends it ranks.
    added: list[Callable[[HostAttempt], None]] = field(default_factory=list)

    def by_name(self) -> dict[str, HostAttempt]:
        """Each host's current record (a host that came back has a new one)."""
        return {host.name: host for host in self.everyone}

    def join(self, new: Sequence[Host]) -> list[HostAttempt]:
        """Connect to, probe and admit the hosts a change added; each joins `everyone`. None of them when they
        could not all be reached or were refused (named in one warning)."""
        if not new:
            return []
        names = ", ".join(host.name for host in new)
        try:
            fresh = self.connect(new)
        except DistrunError as err:
            log.warning("cannot add %s: %s", names, err)
            return []
        joined = [HostAttempt(node, (), idle=True) for node in fresh]  # waited for once it holds ranks
        try:
            self.admit(joined, [*self.everyone, *joined])
        except DistrunError as err:
            log.warning("cannot add %s: %s", names, err)
            self.forget(fresh)
            return []
        self.everyone.extend(joined)
        for host in joined:
            self._came(host)
        return joined

    def revive(self, name: str) -> HostAttempt | None:
        """A host of the attempt whose ranks all ended (back after its cooldown, or chosen for a reset's
        newcomers): a new record on the same connection, its next ranks START a new attempt there. None when
        it is lost or still runs ranks."""
        current = self.by_name().get(name)
        if current is None or not current.finished or current.node.lost:
            return None
        back = HostAttempt(current.node, (), current.facts, idle=True)
        self.everyone.append(back)
        self.began.discard(name)
        self._came(back)
        return back

    def _came(self, host: HostAttempt) -> None:
        for tell in self.added:
            tell(host)


def same_software(hosts: Sequence[HostAttempt], workdirs: Mapping[str, str], *, allow_mismatch: bool) -> None:
    """Refuse hosts that would run another copy of the code (`workdirs`: each host's copy's hash), Python,
    torch, CUDA or NCCL (MismatchError), unless `allow_mismatch`; each difference logged."""
    if len(hosts) < 2:
        return
    from launcher.core.same_software import differences, refuse

    reports = []
    for host in hosts:
        assert host.facts is not None, "the probe sets every host's facts"
        values = dict(host.facts.software or {})
        if host.name in workdirs:
            values["workdir"] = workdirs[host.name]
        reports.append((host.name, values))
    lines = differences(reports)
    for line in lines:
        if allow_mismatch:
            log.warning("%s (--allow-mismatch: running anyway)", line)
        else:
            log.error("%s", line)
    if lines and not allow_mismatch:
        raise refuse(lines)
