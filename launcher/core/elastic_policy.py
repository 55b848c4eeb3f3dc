"""An elastic job's one policy (pure): what a round of a reset in place decides, when a job is below
--min-np, and how long it waits for slots (docs/elastic.md, "The policy").

A round begins with the first loss of the world and ends once every rank of the world has reported: at its
last commit (READY), ended (SUCCESS, FAILURE) or lost with its host (LOST). Only then is it decided, on the
round's whole state, in Horovod's order (its registration's `_on_workers_recorded`), whatever the order and
spacing of the events:

1. any rank that succeeded stops the job;
2. every rank failed stops it with failure;
3. the failed ranks' hosts are left out (the blacklist): a world on one host leaves out only the failed
   slots, since it has no other host to go on with;
4. every host of the world left out is a job failure;
5. past --reset-limit stops it;
6. fewer than --min-np ranks on what is left (survivors and free slots of usable hosts) stops the attempt:
   a whole-job restart may follow (--max-restarts), else the job ends.

Otherwise the survivors reset in place. Rules 1-5 end the job (`Stop.final`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launcher.core.plan import plural


class RankState(enum.Enum):
    RUNNING = "running"
    READY = "ready"  # at its last commit, waiting for the new world
    SUCCESS = "success"
    FAILURE = "failure"
    LOST = "lost"  # its host was lost


@dataclass(frozen=True)
class Limits:
    """An elastic job's bounds: its world size, and how many resets it may make."""

    min_np: int
    max_np: int
    reset_limit: int | None = None


@dataclass(frozen=True)
class RoundRank:
    """One rank's report in a round of an elastic reset."""

    rank_id: int
    host: str
    state: RankState


@dataclass(frozen=True)
class Pending:
    """Some rank of the world has not reported yet: nothing is decided."""


@dataclass(frozen=True)
class Reset:
    """The survivors go on: `left_out` hosts go on the blacklist, `leaving` (ranks at their commit on those
    hosts) leave with exit 0, `survivors` form the new world with up to `size - len(survivors)`
    newcomers."""

    left_out: tuple[str, ...]
    leaving: tuple[int, ...]
    survivors: tuple[int, ...]
    size: int


@dataclass(frozen=True)
class Stop:
    """The attempt stops: `final` the job ends (Horovod's rules), else a whole-job restart may follow."""

    reason: str
    final: bool
    left_out: tuple[str, ...] = ()


Decision = Pending | Reset | Stop


def too_few(slots: int, min_np: int, hosts: Sequence[str], *, verb: str = "left", without: str = "") -> str:
    """The one line for fewer than --min-np slots, wherever it is found (start, preflight, restart, reset)."""
    where = f" without {without}" if without else ""
    names = ", ".join(hosts) or "no hosts"
    return f"only {plural(slots, 'slot', 'slots')} {verb}{where} ({names}), fewer than --min-np {min_np}"


def reset_limit_reached(limit: int, done: int) -> str:
    return f"--reset-limit {limit} reached ({plural(done, 'reset', 'resets')} done)"


def decide_round(
    ranks: Sequence[RoundRank],
    *,
    limits: Limits,
    resets_done: int,
    slots: Mapping[str, int],
    usable: Callable[[str], bool],
    spent: Mapping[str, int] | None = None,
    coming: int = 0,
) -> Decision:
    """The round's decision. `ranks`: every rank of the world, with its state; `slots`: every host the
    attempt may start ranks on (its hosts and connected spares), with its slots; `usable(host)`: not on the
    blacklist now; `spent`: slots of a host that no newcomer takes (failed ranks' slots kept out);
    `coming`: newcomers already chosen (a planned reset's)."""
    if any(r.state is RankState.RUNNING for r in ranks):
        return Pending()
    failed = [r for r in ranks if r.state in (RankState.FAILURE, RankState.LOST)]
    succeeded = [r for r in ranks if r.state is RankState.SUCCESS]
    if succeeded:
        return Stop(f"{plural(len(succeeded), 'rank', 'ranks')} finished: the job ends", final=True)
    if ranks and len(failed) == len(ranks):
        return Stop(f"every rank of the world failed ({plural(len(ranks), 'rank', 'ranks')})", final=True)
    active = list(dict.fromkeys(r.host for r in ranks))
    bad = list(dict.fromkeys(r.host for r in failed))
    lost_hosts = {r.host for r in failed if r.state is RankState.LOST}
    if len(active) == 1 and not lost_hosts:
        bad = []  # a world on one host: only its failed slots leave
    if active and all(host in bad or not usable(host) for host in active):
        every = f"every host of the world is left out ({', '.join(active)})"
        return Stop(every, final=True, left_out=tuple(bad))
    ready = [r for r in ranks if r.state is RankState.READY]
    survivors = tuple(r.rank_id for r in ready if r.host not in bad)
    leaving = tuple(r.rank_id for r in ready if r.host in bad)
    if not survivors:
        return Stop("no rank of the world stays to hand its state on", final=False, left_out=tuple(bad))
    if limits.reset_limit is not None and resets_done >= limits.reset_limit:
        return Stop(reset_limit_reached(limits.reset_limit, resets_done), final=True, left_out=tuple(bad))
    used: dict[str, int] = dict(spent or {})
    for r in ranks:
        if r.host not in bad and (r.rank_id in survivors or r.state is RankState.FAILURE):
            used[r.host] = used.get(r.host, 0) + 1
    free = sum(max(0, n - used.get(host, 0)) for host, n in slots.items() if host not in bad and usable(host))
    size = min(limits.max_np, len(survivors) + free + coming)
    if size < limits.min_np:
        kept = [r.host for r in ready if r.host not in bad]
        hosts = list(dict.fromkeys([*kept, *(h for h in slots if h not in bad and usable(h))]))
        return Stop(
            too_few(size, limits.min_np, hosts, without=", ".join(bad)), final=False, left_out=tuple(bad)
        )
    return Reset(tuple(bad), leaving, survivors, size)


def wake_at(
    now: float, give_up_at: float, back_at: float | None, *, polls: bool, every: float = 1.0
) -> float | None:
    """The one wait on --elastic-timeout, below --min-np: when to look again (the discovery script's next
    poll, else the first cooldown's end); None when nothing can come in time (give up now)."""
    wake = now + every if polls else back_at
    if wake is None or wake > give_up_at:
        return None
    return wake
