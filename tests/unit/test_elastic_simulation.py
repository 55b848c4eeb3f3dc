"""The elastic policy and its driver in deterministic simulation: the real Resetter, HostWatch and blacklist
(launcher.job.elastic, launcher.job.host_watch, launcher.core.elastic_policy) driven by a simulated clock
through thousands of seeded random schedules (rank failures of any subset at any spacing, successes, commits,
link losses, discovery answers that add, drop or repeat hosts, joins refused, cooldowns running out), with the
invariants of docs/elastic.md ("The policy") checked after every step:

- the job ends within one decision once every rank of the world has failed;
- no host left out gets a rank before its time (never, without a cooldown);
- the world is never below --min-np;
- resets stay within --reset-limit;
- every rank is accounted for, and no rank is named that never started;
- a loss while the new world forms opens the round again (its newcomers leave), never a hang or a restart;
- no wait on --elastic-timeout while usable hosts hold --min-np slots.

A failing seed prints the one line that replays it:
`ELASTIC_SIM_SEED=<seed> python -m pytest tests/unit/test_elastic_simulation.py -s`.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from launcher.core.blacklist import Blacklist, CooldownRange
from launcher.core.config import RestartOptions
from launcher.core.elastic_plan import Member, NewWorld
from launcher.core.elastic_policy import Limits, RankState, RoundRank, Stop, decide_round, too_few
from launcher.core.hosts import Host
from launcher.core.plan import Slot
from launcher.core.restart import GiveUp, HostBook, Restart, plan_restart
from launcher.job.discovery import parse_discovery_output
from launcher.job.elastic import Resetter
from launcher.job.host_watch import HostWatch
from launcher.runtime.node import HostAttempt, Node

SCHEDULES = int(os.environ.get("ELASTIC_SIM_SCHEDULES", "2000"))
STEPS = 60
REPLAY = "ELASTIC_SIM_SEED={seed} python -m pytest tests/unit/test_elastic_simulation.py -s"


class SimLink:
    """A link to nobody: what the driver sends is read back from its state, not from frames."""

    heartbeat = False
    peer_addr: str | None = None
    local_addr: str | None = None

    def __init__(self, host: str) -> None:
        self.host = host

    def send(self, data: bytes) -> None:
        pass

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def diagnostics(self) -> str:
        return "cut"


class Violation(AssertionError):
    pass


@dataclass
class Sim:
    seed: int
    rng: random.Random
    hosts: list[Host]
    options: RestartOptions
    now: float = 1000.0
    book: HostBook = field(default_factory=HostBook)
    records: dict[str, HostAttempt] = field(default_factory=dict)
    running: dict[int, str] = field(default_factory=dict)  # rank id -> host, its process runs
    started: set[int] = field(default_factory=set)
    exited: set[int] = field(default_factory=set)
    stopped: str | None = None
    final = False
    lost_hosts: set[str] = field(default_factory=set)
    refused = False  # a join was refused at the last tick
    events: list[str] = field(default_factory=list)
    resetter: Resetter = field(init=False)
    watch: HostWatch = field(init=False)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            tail = "; ".join(self.events[-8:])
            raise Violation(f"{what} (last events: {tail})\nreplay: {REPLAY.format(seed=self.seed)}")

    # -- what the driver asks of the job

    def usable(self, host: str) -> bool:
        return self.book.usable(Host(host), self.now)

    def leave_out(self, host: str, reason: str) -> object:
        return self.book.blacklist.add(host, reason, self.now, self.rng.random())

    def rank_failed(self, host: str, what: str) -> object:
        return self.book.rank_failed(host, what, self.now, self.rng.random())

    def spawn(self, world: NewWorld, newcomers: list[Member], envs: object) -> None:
        for member in newcomers:
            name = member.host.name
            self.check(self.usable(name), f"a newcomer started on {name}, left out until later")
            self.check(name not in self.lost_hosts, f"a newcomer started on lost host {name}")
            # Its agent ended its attempt there: the Supervisor reads it no more, the newcomer never starts.
            self.check(not self.records[name].finished, f"a newcomer sent to {name}, whose ranks all ended")
            self.running[member.rank_id] = name
            self.started.add(member.rank_id)
            if self.rng.random() < 0.8:  # most newcomers reach hvd.elastic.run before the next event
                self.resetter.opted_in(member.rank_id)
            self.records[name].idle = False

    def join(self, new: list[Host]) -> list[HostAttempt]:
        if new and self.rng.random() < 0.3:
            self.events.append(f"join of {[h.name for h in new]} refused")
            self.refused = True
            return []
        joined = []
        for host in new:
            self.check(self.usable(host.name), f"host {host.name} joined before its time")
            record = HostAttempt(Node(host, SimLink(host.name), local=True), (), idle=True)  # type: ignore[arg-type]
            self.records[host.name] = record
            self.lost_hosts.discard(host.name)
            joined.append(record)
            self.resetter.add_host(record)  # AttemptHosts.added
        return joined

    def revive(self, name: str) -> HostAttempt | None:
        self.check(self.usable(name), f"host {name} came back before its cooldown ended")
        old = self.records[name]
        if name in self.lost_hosts:
            return None
        back = HostAttempt(old.node, (), idle=True)
        self.records[name] = back
        self.resetter.add_host(back)  # AttemptHosts.added
        return back

    # -- what the Supervisor does with the agents' frames

    def end_job(self, now: float) -> None:
        self.stop("the host watch ended the job", final=True)

    def add_watch(self, fileobj: IO[Any], on_ready: Any) -> None:
        pass

    def on_stop(self, reason: str, now: float) -> None:
        # A round with no loss (a planned reset) that stops: a rank finished, the job succeeded.
        self.stop(reason, final=self.resetter.final or not self.resetter.causes)

    def stop(self, reason: str, *, final: bool) -> None:
        if self.stopped is None:
            self.stopped, self.final = reason, final

    def exit(self, rank: int, code: int) -> None:
        host = self.running.pop(rank)
        self.exited.add(rank)
        if not any(h == host for h in self.running.values()):
            self.records[host].finished = True
        if code == 0:
            self.resetter.succeeded(rank, self.now)
        else:
            self.absorb([rank], f"rank {rank} (host {host}) exited with code 1")

    def absorb(self, ranks: list[int], cause: str) -> None:
        reset = self.resetter.current
        forming = reset is not None and reset.sent
        if not self.resetter.absorb(ranks, cause, self.now):
            self.check(not forming, "a loss while the new world formed stopped the attempt")
            self.stop(self.resetter.refused or "refused", final=False)

    def lose(self, name: str) -> None:
        self.lost_hosts.add(name)
        record = self.records[name]
        record.finished = True
        ranks = [r for r, h in self.running.items() if h == name]
        for rank in ranks:
            del self.running[rank]
        if not ranks:
            self.resetter.spare_lost(name, "cut")
            return
        self.absorb(ranks, f"lost host {name} (cut)")


def build(seed: int) -> Sim:
    rng = random.Random(seed)
    count = rng.randint(1, 4)
    hosts = [Host(f"h{i}", slots=rng.randint(1, 2)) for i in range(count)]
    total = sum(h.slots for h in hosts)
    min_np = rng.randint(1, max(1, total - 1))
    max_np = rng.randint(total, total + 2)
    cooldown = rng.choice([None, (1.0, 4.0), (5.0, 5.0)])
    script = rng.random() < 0.5
    options = RestartOptions(
        min_np=min_np, max_np=max_np, reset_limit=rng.choice([None, 0, 1, 3]),
        cooldown_range=cooldown, discovery_script=Path("discover.sh") if script else None,
    )  # fmt: skip
    sim = Sim(seed, rng, hosts, options)
    sim.book = HostBook(Blacklist(CooldownRange(*cooldown) if cooldown else None))
    rank = 0
    attempt_hosts = []
    for index, host in enumerate(hosts):
        slots = tuple(Slot(rank + i, i, index, host) for i in range(host.slots))
        record = HostAttempt(Node(host, SimLink(host.name), local=True), slots)  # type: ignore[arg-type]
        sim.records[host.name] = record
        attempt_hosts.append(record)
        for slot in slots:
            sim.running[slot.rank] = host.name
            sim.started.add(slot.rank)
        rank += host.slots
    sim.resetter = Resetter(
        attempt_hosts, min_np=min_np, reset_limit=options.reset_limit, run_id="sim", max_restarts=0,
        master_addr=lambda name: name, note=lambda lines: None, max_np=max_np, spawn=sim.spawn,  # type: ignore[arg-type]
        leave_out=sim.leave_out, rank_failed=sim.rank_failed, usable=sim.usable, revive=sim.revive,
    )  # fmt: skip
    sim.resetter.on_stop = sim.on_stop
    for rank_id in sim.running:
        sim.resetter.opted_in(rank_id)
    sim.watch = HostWatch(
        options.discovery_script, hosts, sim.resetter, sim.join, max_np=max_np, called_before=True,
        usable=sim.usable, revive=sim.revive,
        exclusions=lambda host: sim.book.blacklist.counts.get(host, 0),
    )  # fmt: skip
    sim.watch.next_at = float("inf")  # the script's answers are the schedule's
    sim.watch.attach(sim)
    if script:
        sim.watch.latest = tuple(hosts)
    return sim


def step(sim: Sim) -> None:
    rng, resetter = sim.rng, sim.resetter
    reset = resetter.current
    world = [r for r in resetter.place if r not in resetter.leavers]
    choices: list[str] = ["clock"] * 2
    if sim.running:
        choices += ["fail"] * 2 + ["fail_many", "lose"]
        if rng.random() < 0.05:
            choices.append("succeed")
    if reset is not None and not reset.sent:
        choices += ["ready"] * 10
        if reset.planned is not None and sim.running:
            choices.append("succeed")  # a rank done with its work while the hosts change
    if reset is not None and reset.sent:
        choices += ["synced"] * 10
    if any(r in sim.running for r in resetter.leavers):
        choices.append("leave")
    if any(r not in resetter.opted for r in sim.running):
        choices.append("opt")
    if sim.options.discovery_script is not None:
        choices += ["discover"] * 2
    kind = rng.choice(choices)
    if kind == "fail":
        rank = rng.choice(sorted(sim.running))
        sim.events.append(f"rank {rank} fails")
        sim.exit(rank, 1)
    elif kind == "fail_many":
        ranks = rng.sample(sorted(sim.running), rng.randint(1, len(sim.running)))
        sim.events.append(f"ranks {ranks} fail, {rng.choice(['together', 'apart'])}")
        for rank in ranks:
            if rank in sim.running and sim.stopped is None:
                sim.exit(rank, 1)
    elif kind == "succeed":
        rank = rng.choice(sorted(sim.running))
        sim.events.append(f"rank {rank} succeeds")
        sim.exit(rank, 0)
    elif kind == "lose":
        name = rng.choice(sorted({h for h in sim.running.values()}))
        sim.events.append(f"host {name} lost")
        sim.lose(name)
    elif kind == "ready":
        waiting = [r for r in world if r in sim.running and r not in resetter.at_commit]
        if waiting:
            rank = rng.choice(waiting)
            sim.events.append(f"rank {rank} at its commit")
            resetter.ready(rank, 5000 + rank, sim.now)
    elif kind == "synced":
        assert reset is not None
        left = [r for r in reset.survivors if r not in reset.synced]
        if left:
            rank = rng.choice(left)
            sim.events.append(f"rank {rank} synced")
            resetter.synced(rank, 0.1, sim.now)
    elif kind == "opt":
        rank = rng.choice(sorted(r for r in sim.running if r not in resetter.opted))
        sim.events.append(f"newcomer {rank} opts in")
        resetter.opted_in(rank)
    elif kind == "leave":
        rank = rng.choice(sorted(r for r in resetter.leavers if r in sim.running))
        sim.events.append(f"leaver {rank} exits 0")
        sim.exit(rank, 0)
    elif kind == "discover":
        names = [f"h{i}" for i in range(6)]
        lines = [f"{rng.choice(names)}:{rng.randint(1, 2)}" for _ in range(rng.randint(0, 6))]
        text = "\n".join(lines)
        sim.events.append(f"discovery answers {lines}")
        sim.watch.latest = parse_discovery_output(text, Path("discover.sh"))
        sim.watch.tick(sim.now)
    else:
        sim.now += rng.choice([0.1, 1.0, 3.0, 7.0, 30.0])
        sim.events.append(f"clock {sim.now:g}")
        due = back_from_cooldown(sim) if reset is None else []
        sim.refused = False
        sim.watch.tick(sim.now)
        if due and sim.stopped is None and not sim.refused:
            sim.check(resetter.current is not None, f"{due} back from their cooldown, not taken in")


def back_from_cooldown(sim: Sim) -> list[str]:
    """Hosts of -H (no script) whose ranks all ended when they were left out, whose cooldown is over, with
    room in the world: the next commit takes them in again."""
    if sim.options.discovery_script is not None:
        return []
    resetter = sim.resetter
    world = [r for r in resetter.place if r not in resetter.leavers]
    if len(world) >= (sim.options.max_np or 0) or not world:
        return []
    if not all(r in resetter.opted for r in world):
        return []  # a newcomer not in hvd.elastic.run yet: the change waits for it
    return [
        host.name
        for host in sim.hosts
        if host.name in sim.book.blacklist.excluded
        and sim.book.usable(host, sim.now)
        and host.name not in sim.lost_hosts
        and sim.records[host.name].finished
    ]


def check(sim: Sim) -> None:
    resetter = sim.resetter
    limits = Limits(sim.options.min_np or 1, sim.options.max_np or 1, sim.options.reset_limit)
    reset = resetter.current
    # Every rank of the world failed: the round is decided, and it ended the job.
    ranks = resetter.round_ranks()
    failed = (RankState.FAILURE, RankState.LOST)
    if ranks and all(r.state in failed for r in ranks) and reset is not None and not reset.sent:
        sim.check(sim.stopped is not None and sim.final, "every rank failed, yet the job goes on")
    # The world never below --min-np; resets within --reset-limit.
    for record in resetter.records:
        sim.check(record.size >= limits.min_np, f"a world of {record.size} formed, below --min-np")
    if reset is not None and reset.sent:
        sim.check(reset.size >= limits.min_np, f"a world of {reset.size} forming, below --min-np")
    if limits.reset_limit is not None:
        formed = len(resetter.records) + (1 if reset is not None and reset.sent else 0)
        sim.check(formed <= limits.reset_limit, f"{formed} resets past --reset-limit {limits.reset_limit}")
    # Every rank accounted for: each is in the world, failed, leaving or exited; none named never started.
    named = set(resetter.host_of)
    sim.check(named <= sim.started, f"ranks {sorted(named - sim.started)} named, never started")
    for rank in named:
        placed = rank in resetter.place or rank in resetter.failed or rank in resetter.leavers
        sim.check(placed or rank in sim.exited, f"rank {rank} is nowhere")
    for rank, host in sim.running.items():
        sim.check(rank in named and resetter.host_of[rank] == host, f"running rank {rank} unknown")
    # No host left out runs a rank it got since (checked at each start), nor holds a world's rank now
    # unless it held it before being left out.


def check_end(sim: Sim) -> None:
    """The attempt stopped: one that is not final is followed by a whole-job restart with no wait on
    --elastic-timeout while usable hosts hold --min-np slots."""
    if sim.stopped is None or sim.final:
        return
    min_np = sim.options.min_np or 1
    candidates = [h for h in sim.hosts if sim.book.usable(h, sim.now)]
    verdict = plan_restart(
        "sim", None, options=sim.options, hosts=sim.hosts, num_proc=len(sim.started), book=sim.book,
        now=sim.now,
    )  # fmt: skip
    usable_slots = sum(h.slots for h in candidates)
    if usable_slots >= min_np:
        sim.check(
            isinstance(verdict, Restart), f"waits on --elastic-timeout with {usable_slots} usable slots"
        )
    else:
        sim.check(isinstance(verdict, GiveUp) and verdict.below_min_np, "restarts below --min-np")


def run_schedule(seed: int) -> Sim:
    sim = build(seed)
    for _ in range(STEPS):
        if sim.stopped is not None or not sim.running:
            break
        step(sim)
        check(sim)
    check_end(sim)
    return sim


def test_thousands_of_seeded_schedules_keep_every_invariant() -> None:
    only = os.environ.get("ELASTIC_SIM_SEED")
    seeds = [int(only)] if only else list(range(SCHEDULES))
    began = time.monotonic()
    stopped = final = resets = 0
    for seed in seeds:
        try:
            sim = run_schedule(seed)
        except Violation:
            raise
        except Exception as err:
            raise AssertionError(f"{err!r}\nreplay: {REPLAY.format(seed=seed)}") from err
        stopped += sim.stopped is not None
        final += sim.final
        resets += len(sim.resetter.records)
    print(
        f"{len(seeds)} schedules in {time.monotonic() - began:.1f}s: {resets} resets, {stopped} stopped "
        f"({final} by Horovod's rules)"
    )
    assert resets > 0 and final > 0, "the schedules reach resets and final decisions"


def test_all_ranks_failing_apart_ends_the_job_within_one_decision() -> None:
    ranks = [RoundRank(r, f"h{r // 2}", RankState.FAILURE) for r in range(4)]
    decision = decide_round(
        ranks, limits=Limits(2, 4), resets_done=0, slots={"h0": 2, "h1": 2}, usable=lambda h: True
    )
    assert decision == Stop("every rank of the world failed (4 ranks)", final=True)


def test_the_rules_apply_in_horovods_order() -> None:
    def state(*states: RankState) -> list[RoundRank]:
        return [RoundRank(r, f"h{r // 2}", s) for r, s in enumerate(states)]

    f, ready, ok = RankState.FAILURE, RankState.READY, RankState.SUCCESS
    slots = {"h0": 2, "h1": 2}

    def decide(ranks: list[RoundRank], done: int = 0, limit: int | None = None) -> object:
        return decide_round(
            ranks, limits=Limits(1, 4, limit), resets_done=done, slots=slots, usable=lambda h: True
        )

    assert isinstance(decide(state(f, ok, f, f)), Stop), "any success stops the job"
    assert decide(state(f, ready, f, ready)) == Stop(
        "every host of the world is left out (h0, h1)", final=True, left_out=("h0", "h1")
    )
    assert decide(state(f, ready, ready, ready), 1, 1) == Stop(
        "--reset-limit 1 reached (1 reset done)", final=True, left_out=("h0",)
    )
    reset = decide(state(f, ready, ready, ready))
    assert reset == decide_round(
        state(f, ready, ready, ready), limits=Limits(1, 4), resets_done=0, slots=slots, usable=lambda h: True
    )
    assert getattr(reset, "left_out", None) == ("h0",) and getattr(reset, "leaving", None) == (1,)
    assert too_few(1, 2, ["h1"], without="h0") == "only 1 slot left without h0 (h1), fewer than --min-np 2"
