"""The launcher's elastic driver: resets in place while an attempt runs (docs/elastic.md).

A state of the running attempt's phase (the Supervisor hands it the elastic frames and the failures), never
a blocking call: while a reset waits for the ranks, the loop still answers `distrun stacks`, signals and the
deadline. A reset goes: the survivors hear `peer_lost` (NOTICE); each says it is at its last commit
(RANK_READY, with a port free on its host); every survivor gets its new identity (RESET), the rendezvous on
the new rank 0's host; each says when the new world's first collective ran (RANK_SYNCED). Who gets which rank
is `launcher.core.elastic_plan`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from launcher.agent.protocol import LEAVE, NOTICE, RESET, LeaveRequest, Notice, ResetRequest
from launcher.core.elastic_plan import Member, NewWorld, new_world, reset_envs
from launcher.core.elastic_policy import (
    Limits,
    Pending,
    RankState,
    Reset,
    RoundRank,
    Stop,
    decide_round,
    reset_limit_reached,
    too_few,
)
from launcher.core.host_changes import Regrouping
from launcher.core.hosts import Host
from launcher.runtime.node import HostAttempt

log = logging.getLogger(__name__)

# Starts the newcomers of the new world (its members that had no rank yet); `envs`: every member's identity.
Spawn = Callable[[NewWorld, Sequence[Member], Mapping[int, Mapping[str, str]]], None]


@dataclass(frozen=True)
class ResetRecord:
    """One reset, for the console and --report."""

    at: float  # wall clock, when the failure was seen
    cause: str
    left: tuple[str, ...]  # hosts whose ranks left the world
    joined: tuple[str, ...]
    left_ranks: tuple[int, ...]
    size: int
    recovery_s: float  # from the failure to the new world's first collective (the ranks' slowest `synced`)
    planned: bool = False  # the discovery script's hosts changed: no failure, every rank at the same commit
    size_before: int | None = None  # the old world's size

    def to_json(self) -> dict[str, object]:
        return {
            "at": self.at, "cause": self.cause, "hosts_left": list(self.left),
            "hosts_joined": list(self.joined),
            "ranks_left": list(self.left_ranks), "size": self.size, "recovery_s": round(self.recovery_s, 3),
            **({} if self.size_before is None else {"size_before": self.size_before}),
        }  # fmt: skip


@dataclass
class _Reset:
    """The reset under way."""

    cause: str
    began: float  # monotonic
    at: float
    left: list[int]
    survivors: list[int]  # rank ids in their old rank order
    synced: dict[int, float] = field(default_factory=dict)
    joined: list[str] = field(default_factory=list)  # the newcomers' hosts
    size: int = 0  # the new world's, once known
    sent: bool = False  # the new identities went out: a loss from here opens the round again (`_reopen`)
    # A hosts update's (launcher.job.host_watch): the newcomers chosen with it, and the ranks that leave.
    planned: list[Member] | None = None
    leaving: list[int] = field(default_factory=list)
    noticed: set[int] = field(default_factory=set)  # ranks told `peer_lost` in this round


class Resetter:
    """Which ranks opted in, where each rank is in the world, and the reset under way, if any."""

    def __init__(
        self,
        hosts: Sequence[HostAttempt],
        *,
        min_np: int,
        reset_limit: int | None,
        run_id: str,
        max_restarts: int,
        master_addr: Callable[[str], str],
        note: Callable[[list[str]], None],
        done_before: int = 0,
        max_np: int | None = None,
        spawn: Spawn | None = None,
        leave_out: Callable[[str, str], object] | None = None,
        rank_failed: Callable[[str, str], object] | None = None,
        usable: Callable[[str], bool] = lambda host: True,
        revive: Callable[[str], HostAttempt | None] = lambda host: None,
    ) -> None:
        """`master_addr(host)`: an address of that host every host reaches; `note`: a console line;
        `spawn(world, newcomers, envs)` starts ranks on free slots of the attempt's hosts (spare hosts among
        them, after the others), up to `max_np`, on hosts `usable(host)`; `leave_out(host, reason)` blacklists
        a host, `rank_failed(host, what)` counts a rank's failure there (the blacklist's rule); `revive(host)`
        gives a host whose ranks all ended a new record (launcher.job.attempt_hosts), which comes back through
        `add_host`."""
        self.hosts = {host.name: host for host in hosts}
        self.host_of = {slot.rank: host.name for host in hosts for slot in host.slots}
        self.place = {slot.rank: slot.rank for host in hosts for slot in host.slots}  # rank id -> rank
        self.host_values: dict[str, Host] = {host.name: host.node.host for host in hosts}
        self.opted: set[int] = set()
        # Rank id -> a port free on its host, from each rank at its reset point; kept with no reset under way:
        # a survivor may see its peer gone before the agent has reaped it.
        self.at_commit: dict[int, int] = {}
        self.min_np = min_np
        self.reset_limit = reset_limit
        self.run_id = run_id
        self.max_restarts = max_restarts
        self.master_addr = master_addr
        self.note = note
        self.records: list[ResetRecord] = []
        self.done_before = done_before
        self.current: _Reset | None = None
        self.max_np = max_np
        self.spawn = spawn
        self.failed: list[int] = []  # rank ids lost in this attempt
        self.freed: set[int] = set()  # of them, those whose slot is free again (their host came back)
        self.gone_hosts: set[str] = set()  # lost mid-attempt: no newcomer goes there
        self.unlisted: set[str] = set()  # dropped from the discovery script's answer: nor there
        self.next_id = max(self.host_of, default=-1) + 1
        self.refused: str | None = None  # why the last loss could not be absorbed (the job restarts whole)
        self.leavers: set[int] = set()  # told to leave by a hosts update: their end is no loss
        self.leave_out = leave_out
        self.rank_failed = rank_failed
        self.usable = usable
        self.revive = revive
        # The round under way: each rank's state once it ended or was lost (READY is `at_commit`), and why.
        self.states: dict[int, RankState] = {}
        self.causes: list[str] = []
        self.final = False  # the last round's decision ends the job (Horovod's rules), no whole restart
        # Called with the reason when a round decides that the attempt stops (the Supervisor stops it).
        self.on_stop: Callable[[str, float], None] | None = None

    @property
    def resetting(self) -> bool:
        return self.current is not None

    def doing(self) -> str:
        reset = self.current
        if reset is None:
            return "running its ranks"
        waiting = "the new world's first collective" if reset.sent else "the survivors' last commit"
        return f"resetting the world ({reset.cause}): waiting for {waiting}"

    # -- frames from the agents

    def opted_in(self, rank_id: int) -> None:
        self.opted.add(rank_id)

    def ready(self, rank_id: int, port: int, now: float) -> None:
        self.at_commit[rank_id] = port
        reset = self.current
        if reset is not None:
            self._decide(reset, now)

    def synced(self, rank_id: int, seconds: float, now: float) -> None:
        reset = self.current
        if reset is None or not reset.sent or rank_id not in reset.survivors:
            return
        reset.synced[rank_id] = seconds
        if set(reset.synced) >= set(reset.survivors):
            self._finish(reset, now)

    # -- a loss

    def spare_lost(self, host: str, detail: str) -> None:
        """A spare host without a rank was lost: no newcomer goes there; nothing else changes."""
        self.gone_hosts.add(host)
        if self.leave_out is not None:
            self.leave_out(host, f"lost while a spare ({detail})")

    def absorb(self, lost: Sequence[int], cause: str, now: float) -> bool:
        """Record the `lost` rank ids in the round (opening it with the first loss); the round is decided once
        every rank of the world reported (launcher.core.elastic_policy). False when no reset in place can
        follow at all (the reason in `refused`): the job stops at once."""
        host_lost = cause.startswith("lost host ")
        if host_lost:  # whoever ran there (ranks leaving too): no newcomer goes there
            gone = {self.host_of[r] for r in lost} - self.gone_hosts
            self.gone_hosts.update(gone)
            if self.leave_out is not None:
                for name in sorted(gone):
                    self.leave_out(name, "lost " + cause.removeprefix(f"lost host {name} "))
        lost = [r for r in lost if r not in self.leavers and r in self.place]
        if not lost:
            return True
        reset = self.current
        excused: set[int] = set()
        if reset is not None and reset.sent:
            excused = self._reopen(reset, lost)
        world = self._by_rank()
        if not all(rank_id in self.opted for rank_id in world if rank_id not in excused):
            self.refused = "not every rank uses hvd.elastic"
            return False
        for rank_id in lost:
            self.states[rank_id] = RankState.LOST if host_lost else RankState.FAILURE
        if reset is None:
            survivors = [r for r in world if r not in lost]
            reset = _Reset(cause, now, time.time(), [], survivors)
            self.current = reset
            log.info("elastic reset: %s", cause)
        self.causes.extend(cause for _ in lost)
        self._notify(reset)
        self._decide(reset, now)
        return True

    def _reopen(self, reset: _Reset, lost: Sequence[int]) -> set[int]:
        """A loss while the new world formed (its identities sent, not every survivor synced): that world
        never trained as one, so the round opens again on it. Its newcomers leave (they hold no state; the
        next decision chooses newcomers afresh) and its survivors report at their commit again. The
        newcomers among `lost`, which never opted in, are returned: this round's failures all the same."""
        newcomers = [r for r in self.place if r not in reset.survivors]
        leaving = [r for r in newcomers if r not in lost]
        for rank_id in leaving:
            self.place.pop(rank_id)
        self.leavers.update(leaving)
        self._tell_leave(leaving)
        reset.sent = False
        reset.synced.clear()
        reset.joined.clear()
        reset.noticed.clear()
        reset.size = 0
        reset.planned = None  # its newcomers are gone: a planned reset's too
        log.info("elastic reset: a rank was lost while the new world formed; the round opens again")
        return {r for r in newcomers if r in lost}

    def succeeded(self, rank_id: int, now: float) -> None:
        """A rank of the world exited 0: in a round, Horovod's first rule (any success stops the job)."""
        if rank_id in self.leavers or rank_id not in self.place:
            return
        reset = self.current
        if reset is not None and not reset.sent and not self.causes:
            # A planned reset (no loss): the rank that finished is simply not in the new world.
            self.place.pop(rank_id)
            self.leavers.add(rank_id)
            reset.survivors = [r for r in reset.survivors if r != rank_id]
            self._decide(reset, now)
            return
        self.states[rank_id] = RankState.SUCCESS
        if reset is not None and not reset.sent:
            self._decide(reset, now)

    def _notify(self, reset: _Reset) -> None:
        """NOTICE `peer_lost` to every rank of the world still running that has not heard it."""
        by_host: dict[str, list[int]] = {}
        for rank_id in self._by_rank():
            if rank_id in self.states or rank_id in reset.noticed or rank_id in self.leavers:
                continue
            reset.noticed.add(rank_id)
            by_host.setdefault(self.host_of[rank_id], []).append(rank_id)
        for name, ranks in by_host.items():
            self.hosts[name].node.send(NOTICE, Notice(ranks))

    def round_ranks(self) -> list[RoundRank]:
        """Every rank of the world (those leaving at a planned reset aside) with its state in the round."""
        ranks = []
        for rank_id in self._by_rank():
            if rank_id in self.leavers:
                continue
            state = self.states.get(rank_id)
            if state is None:
                state = RankState.READY if rank_id in self.at_commit else RankState.RUNNING
            ranks.append(RoundRank(rank_id, self.host_of[rank_id], state))
        return ranks

    def _decide(self, reset: _Reset, now: float) -> None:
        """The round's decision once every rank reported: the reset goes on, or the attempt stops."""
        if reset.sent:
            return
        spent = self.spent()
        slots = {name: host.slots for name, host in self.host_values.items() if self._open(name)}
        if reset.planned is not None or self.spawn is None or self.max_np is None:
            slots = {}  # no newcomers to choose: a planned reset's are chosen already
        decision = decide_round(
            self.round_ranks(), limits=self.limits(), resets_done=self.done_before + len(self.records),
            slots=slots, usable=self.usable, spent=spent, coming=len(reset.planned or ()),
        )  # fmt: skip
        if isinstance(decision, Pending):
            return
        cause = self.causes[0] if self.causes else reset.cause
        for name in decision.left_out:
            if name not in self.gone_hosts and self.leave_out is not None:
                self.leave_out(name, f"a rank failed there ({cause})")
        if isinstance(decision, Reset) and reset.planned is not None:
            # Chosen at the change: a host may have been left out, lost or dropped since.
            planned = [
                m for m in reset.planned if m.host.name not in decision.left_out and self._open(m.host.name)
            ]
            if len(decision.survivors) + len(planned) < self.min_np:
                names = sorted({self.host_of[r] for r in decision.survivors} | {m.host.name for m in planned})
                decision = Stop(
                    too_few(len(decision.survivors) + len(planned), self.min_np, names), final=False
                )
            else:
                reset.planned = planned
        if isinstance(decision, Stop):
            self._stop(decision.reason, decision.final, now)
            return
        assert isinstance(decision, Reset)
        lost = [r for r, state in self.states.items() if state in (RankState.FAILURE, RankState.LOST)]
        for rank_id in lost:
            self.place.pop(rank_id, None)
            self.failed.append(rank_id)
            host = self.host_of[rank_id]
            counted = self.states[rank_id] is RankState.FAILURE and host not in decision.left_out
            if counted and self.rank_failed is not None:
                self.rank_failed(host, cause)
        for rank_id in decision.leaving:
            self.place.pop(rank_id, None)
        self.leavers.update(decision.leaving)
        self.states.clear()
        self.causes.clear()
        reset.left.extend([*lost, *decision.leaving])
        reset.leaving.extend(decision.leaving)
        reset.survivors = list(decision.survivors)
        short = self._send_new_world(reset)
        if short is not None:
            self._stop(short, False, now)

    def _stop(self, reason: str, final: bool, now: float) -> None:
        """The round decided that the attempt stops (`final`: the job ends, no whole-job restart)."""
        self.refused, self.final = reason, final
        if self.on_stop is not None:
            self.on_stop(reason, now)

    def spent(self) -> Counter[str]:
        """Slots of each host that no newcomer takes: failed ranks' (left out, not refilled)."""
        return Counter(self.host_of[r] for r in self.failed if r not in self.freed)

    def limits(self) -> Limits:
        return Limits(self.min_np, self.max_np or len(self.place), self.reset_limit)

    def host_back(self, name: str) -> None:
        """A host back from its cooldown: its failed ranks' slots are free again. One that was lost stays
        closed to newcomers until it is reached again (`add_host`)."""
        self.freed.update(r for r in self.failed if self.host_of[r] == name)

    def _open(self, name: str) -> bool:
        """Whether a newcomer may go to that host: neither lost nor dropped by the discovery script."""
        return name not in self.gone_hosts and name not in self.unlisted

    # -- a planned change (the discovery script's hosts)

    def add_host(self, host: HostAttempt) -> None:
        """A host the discovery script added, connected and probed: newcomers may start there."""
        self.hosts[host.name] = host
        self.host_values[host.name] = host.node.host
        self.gone_hosts.discard(host.name)

    def listed(self, names: Collection[str]) -> None:
        """The hosts the world may have now (the discovery script's answer, as applied): a host it dropped
        takes no newcomer when a later loss frees slots, though its agent may still be connected."""
        self.unlisted = set(self.host_values) - set(names)

    def members(self) -> list[tuple[int, str]]:
        """(rank id, host) of every rank of the world, in rank order."""
        return [(rank_id, self.host_of[rank_id]) for rank_id in self._by_rank()]

    def world(self) -> tuple[list[tuple[int, str]], dict[int, str]]:
        """The world now, for `distrun top`: (rank id, host) of its ranks in rank order, and rank id -> host
        of each rank that left it (lost, or told to leave by a reset)."""
        # A rank lost in the round still being decided has left the world already, whatever the decision.
        lost = {r for r, state in self.states.items() if state in (RankState.FAILURE, RankState.LOST)}
        gone = [*self.failed, *self.leavers, *lost]
        members = [(r, host) for r, host in self.members() if r not in lost]
        return members, {r: self.host_of[r] for r in gone if r not in self.place or r in lost}

    def change_hosts(self, cause: str, update: int, regrouped: Regrouping, now: float) -> str | None:
        """Begin a planned reset: every rank hears `hosts_updated` and raises HostsUpdatedInterrupt at its
        next commit; then those leaving get LEAVE, those staying RESET, and the newcomers start. None when it
        began, else why not (the world stays as it is)."""
        staying, leaving = regrouped.staying, regrouped.leaving
        newcomers = regrouped.newcomers
        alive = self._by_rank()
        refusal = self._refusal(list(staying), None, len(staying) + len(newcomers), alive)
        if refusal is None and not staying:
            refusal = "no rank of the world stays to hand its state on"
        if refusal is not None:
            self.refused = refusal
            return refusal
        members = []
        for host in newcomers:
            # Its host is known once it starts (`_send_new_world`): a newcomer that never came is no rank.
            members.append(Member(self.next_id, host))
            self.next_id += 1
        for rank_id in leaving:
            self.place.pop(rank_id, None)
        self.leavers.update(leaving)
        self.at_commit.clear()  # a port from before the update would be stale
        self.current = _Reset(
            cause, now, time.time(), list(leaving), list(staying), planned=members, leaving=list(leaving)
        )
        log.info("elastic reset: %s", cause)
        by_host: dict[str, list[int]] = {}
        for rank_id in alive:
            by_host.setdefault(self.host_of[rank_id], []).append(rank_id)
        stamp = time.time()
        for name, ranks in by_host.items():
            self.hosts[name].node.send(NOTICE, Notice(ranks, "hosts_updated", stamp, update))
        return None

    def _refusal(
        self,
        alive: Sequence[int],
        reset: _Reset | None,
        size: int | None = None,
        opting: Sequence[int] | None = None,
    ) -> str | None:
        if not all(rank_id in self.opted for rank_id in (alive if opting is None else opting)):
            return "not every rank uses hvd.elastic"
        size = len(alive) if size is None else size
        if size < self.min_np:
            return too_few(size, self.min_np, sorted({self.host_of[r] for r in alive}))
        used = self.done_before + len(self.records)
        if reset is None and self.reset_limit is not None and used >= self.reset_limit:
            return reset_limit_reached(self.reset_limit, used)
        return None

    def _by_rank(self) -> list[int]:
        return sorted(self.place, key=lambda rank_id: self.place[rank_id])

    def _newcomers(self, survivors: Sequence[int]) -> list[Member]:
        """New ranks on the spare slots of the attempt's hosts, in host order."""
        if self.spawn is None or self.max_np is None:
            return []
        wanted = self.max_np - len(survivors)
        used = {name: 0 for name in self.host_values}
        # A failed rank's slot counts as used: it is left out, not refilled; spares are slots beyond them.
        for rank_id in [*survivors, *(r for r in self.failed if r not in self.freed)]:
            used[self.host_of[rank_id]] += 1
        members: list[Member] = []
        for name, host in self.host_values.items():
            free = host.slots - used[name] if self._open(name) and self.usable(name) else 0
            while free > 0 and len(members) < wanted:
                members.append(Member(self.next_id, host))
                self.host_of[self.next_id] = name
                self.next_id += 1
                free -= 1
        return members

    def _send_new_world(self, reset: _Reset) -> str | None:
        """Send the new world out; None, or why it is not (fewer than --min-np ranks: the failures the round
        counted may have left a host out since it was decided, and its slots with it)."""
        newcomers = reset.planned if reset.planned is not None else self._newcomers(reset.survivors)
        if len(reset.survivors) + len(newcomers) < self.min_np:
            if reset.planned is None:
                for member in newcomers:
                    self.host_of.pop(member.rank_id)
            names = sorted({self.host_of[r] for r in reset.survivors} | {m.host.name for m in newcomers})
            return too_few(len(reset.survivors) + len(newcomers), self.min_np, names)
        survivors = [Member(r, self.host_values[self.host_of[r]]) for r in reset.survivors]
        world = new_world(survivors, newcomers)
        rank0 = reset.survivors[0]
        envs = reset_envs(
            world, master_addr=self.master_addr(self.host_of[rank0]), master_port=self.at_commit[rank0],
            run_id=self.run_id, resets=self.done_before + len(self.records) + 1,
            max_restarts=self.max_restarts,
        )  # fmt: skip
        by_host: dict[str, dict[str, dict[str, str]]] = {}
        for rank_id in reset.survivors:
            by_host.setdefault(self.host_of[rank_id], {})[str(rank_id)] = envs[rank_id]
            self.place[rank_id] = world.rank_of(rank_id)
        for name, host_envs in by_host.items():
            self.hosts[name].node.send(RESET, ResetRequest(host_envs))
        self._tell_leave(reset.leaving)
        self.at_commit.clear()
        reset.sent = True
        reset.size = world.plan.world_size
        if newcomers:
            assert self.spawn is not None
            for name in dict.fromkeys(member.host.name for member in newcomers):
                if self.hosts[name].finished:
                    # Every rank there ended (its newcomers left a round that opened again, say): its agent
                    # ended its attempt there, and the Supervisor reads it no more until it has a new record.
                    self.revive(name)
            for member in newcomers:
                self.place[member.rank_id] = world.rank_of(member.rank_id)
                self.host_of[member.rank_id] = member.host.name
            reset.joined = [member.host.name for member in newcomers]
            reset.size = world.plan.world_size
            self.spawn(world, newcomers, envs)
        return None

    def _tell_leave(self, ranks: Sequence[int]) -> None:
        by_host: dict[str, list[int]] = {}
        for rank_id in ranks:
            by_host.setdefault(self.host_of[rank_id], []).append(rank_id)
        for name, on_host in by_host.items():
            self.hosts[name].node.send(LEAVE, LeaveRequest(on_host))

    def _finish(self, reset: _Reset, now: float) -> None:
        recovery = max(reset.synced.values()) if reset.synced else now - reset.began
        left_hosts = tuple(dict.fromkeys(self.host_of[r] for r in reset.left))
        joined = tuple(dict.fromkeys(reset.joined))
        size = reset.size or len(reset.survivors)
        record = ResetRecord(
            reset.at, reset.cause, left_hosts, joined, tuple(reset.left), size, recovery,
            planned=reset.planned is not None, size_before=len(reset.survivors) + len(reset.left),
        )  # fmt: skip
        self.records.append(record)
        self.current = None
        self.note([reset_line(self.done_before + len(self.records), record)])


def reset_line(number: int, record: ResetRecord) -> str:
    """The console's one line per reset: why, who left, who joined, the new size, how long it took."""
    left = ", ".join(f"rank {r}" for r in record.left_ranks) or "none"
    if record.left:
        left += f" (on {', '.join(record.left)})"
    joined = ", ".join(record.joined) or "none"
    return (
        f"reset {number}: {record.cause}; left: {left}; joined: {joined}; world size {record.size}; "
        f"training again {record.recovery_s:.2f}s after the {'commit' if record.planned else 'failure'}"
    )
