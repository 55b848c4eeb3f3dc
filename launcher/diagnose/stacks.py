"""Every rank's stacks, grouped: ranks with the same stacks are one group, the odd rank out first (pure).

The agents read the stacks (`launcher.agent.stackdump`); this module turns their answers into what a person
reads
when a job hangs: groups with the fewest ranks first (the rank that is elsewhere is usually the bug), each
headed by its ranks in `--ranks` notation and its hosts, every thread's frames innermost last as Python
tracebacks show them, ranks that could not be read named with the reason, and a one-line verdict.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.core.plan import plural
from launcher.diagnose.collective_verdict import (
    RankProgress,
    collective_verdict,
    progress_line,
    record_json,
    records_of,
)
from launcher.diagnose.readable import is_library, readable, shorten_symbol

# Where a frame's file or native symbol says the rank is inside a collective: torch.distributed (c10d, its
# gloo and NCCL back ends, in Python or native frames) or distrun's own `collectives` library.
_COLLECTIVE_PATHS = ("/torch/distributed/", "/collectives/")
_COLLECTIVE_SYMBOLS = ("c10d", "gloo", "nccl")
# faulthandler's limit: a stack it cut lacks its outermost frames.
CUT_AT = 100
OTHERS_UNREAD = (
    "not read while the main thread waits in native code (reading them then could crash the rank); "
    "with py-spy installed, distrun stacks reads every thread"
)


# Ordered: a rank's signature sorts its threads, and two threads may differ only in their frames.
@dataclass(frozen=True, order=True)
class Frame:
    """One frame of a stack: Python's, or a native one py-spy saw."""

    func: str
    file: str
    line: int = 0  # 0: unknown (a native frame)
    native: bool = False

    @property
    def where(self) -> str:
        """`func, file.py:41`, as the verdict names a place."""
        base = posixpath.basename(self.file) or self.file
        return f"{self.func}, {base}:{self.line}" if self.line else f"{self.func} ({base})"

    def text(self, short: bool = False) -> str:
        """As a traceback line; `short`: a native name without its C++ template arguments."""
        if self.native:
            func = shorten_symbol(self.func) if short else self.func
            return f"[native] {func} ({posixpath.basename(self.file) or '?'})"
        return f'File "{self.file}", line {self.line}, in {self.func}'


@dataclass(frozen=True)
class ThreadStack:
    """One thread's frames, outermost first and innermost last. `main`: the rank's main thread. `truncated`:
    its outermost frames are missing (faulthandler stops at 100, and the whole stack could not be read).
    `others_unread`: the rank's other threads, if any ran Python, were not read (faulthandler reads the main
    thread alone, and the whole stacks could not be read: its main thread waits in native code)."""

    name: str
    frames: tuple[Frame, ...]
    main: bool = False
    truncated: bool = False
    others_unread: bool = False


@dataclass(frozen=True)
class RankStacks:
    """What one rank's agent read: its threads (`source` says how), or `error`, why it could not."""

    rank: int
    host: str
    pid: int | None = None
    source: str = ""
    threads: tuple[ThreadStack, ...] = ()
    error: str = ""
    # Its latest collectives, where it keeps a record (launcher.diagnose.collective_verdict).
    collectives: tuple[RankProgress, ...] = ()

    @classmethod
    def from_json(cls, host: str, data: dict[str, Any]) -> RankStacks:
        """From an agent's answer (`launcher.agent.stackdump.Dumped`'s dict form)."""
        threads = tuple(
            ThreadStack(
                str(t.get("name", "")),
                tuple(
                    Frame(str(f[0]), str(f[1]), int(f[2]), bool(f[3]) if len(f) > 3 else False)
                    for f in t.get("frames", ())
                ),
                bool(t.get("main", False)),
                bool(t.get("truncated", False)),
                bool(t.get("others_unread", False)),
            )
            for t in data.get("threads", ())
        )
        return cls(
            int(data["rank"]),
            host,
            data.get("pid"),
            str(data.get("source", "")),
            threads,
            str(data.get("error", "")),
            records_of(int(data["rank"]), data.get("collectives")),
        )

    @property
    def main_stack(self) -> ThreadStack | None:
        """The thread marked main; where none is, or several are (a garbled dump), the first of them in the
        order shown, so that the verdict never depends on the order the stack tool listed them in."""
        mains = [t for t in self.threads if t.main] or list(self.threads)
        return min(mains, key=_thread_order) if mains else None

    def signature(self) -> tuple[Any, ...]:
        """What ranks must share to be one group: every thread's Python frames. Not thread ids, which differ,
        nor native frames, which py-spy gives for one rank and not for another it had less time for."""
        if self.error:
            return ("error", self.error)
        return tuple(
            sorted(
                (not t.main, t.truncated, t.others_unread, tuple(f for f in t.frames if not f.native))
                for t in self.threads
            )
        )

    @property
    def frame_count(self) -> int:
        return sum(len(t.frames) for t in self.threads)


@dataclass(frozen=True)
class Group:
    """Ranks whose Python stacks are the same, shown once."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    sample: RankStacks  # every rank of the group has these Python stacks

    @property
    def error(self) -> str:
        return self.sample.error


def rank_ranges(ranks: Iterable[int]) -> str:
    """`0-1,3`: the notation `--ranks` reads."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    start = prev = None
    for rank in [*ordered, None]:
        if prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None and prev is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rank
    return ",".join(parts)


def ranks_label(ranks: Sequence[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)}"


def group_stacks(stacks: Iterable[RankStacks]) -> list[Group]:
    """Readable groups, fewest ranks first (then by lowest rank), then the unreadable ones by reason."""
    by_key: dict[tuple[Any, ...], list[RankStacks]] = {}
    for rank in sorted(stacks, key=lambda s: s.rank):
        by_key.setdefault(rank.signature(), []).append(rank)
    groups = [
        Group(
            tuple(r.rank for r in members),
            tuple(dict.fromkeys(r.host for r in members)),
            # The fullest: a member whose native frames were read says the most.
            max(members, key=lambda r: (r.frame_count, -r.rank)),
        )
        for members in by_key.values()
    ]
    return sorted(groups, key=lambda g: (bool(g.error), len(g.ranks), g.ranks[0]))


def _own(frame: Frame) -> bool:
    """A frame of the user's own code: Python, neither the interpreter's library nor an installed package,
    nor a collective library's (whose wrappers, `hvd.elastic.run`'s say, call the user's code back)."""
    return not frame.native and not is_library(frame.file) and not _collective_path(frame)


def _collective_path(frame: Frame) -> bool:
    return not frame.native and any(p in frame.file for p in _COLLECTIVE_PATHS)


def _collective_index(stack: ThreadStack | None) -> int | None:
    """The index of a thread's innermost collective frame, or None: only one inside (called from) the
    thread's innermost frame of the user's own code counts. A collective library's frame further out is a
    wrapper that called the user back (`hvd.elastic.run`), and a rank sleeping in the user's code is in no
    collective.

    Python frames come first: `barrier` says more than the native `gloo::...` beneath it.
    """
    if stack is None:
        return None
    own = [i for i, frame in enumerate(stack.frames) if _own(frame)]
    inner_first = [(i, f) for i, f in reversed(list(enumerate(stack.frames))) if i > (own[-1] if own else -1)]
    for index, frame in inner_first:
        if _collective_path(frame):
            return index
    for index, frame in inner_first:
        if frame.native and any(s in f"{frame.func} {frame.file}".lower() for s in _COLLECTIVE_SYMBOLS):
            return index
    return None


def collective_of(stack: ThreadStack | None) -> str | None:
    """The collective a thread waits in (its innermost collective frame's function), or None."""
    index = _collective_index(stack)
    return None if stack is None or index is None else stack.frames[index].func


def _place_index(stack: ThreadStack) -> int:
    """The index of a thread's innermost frame of the user's own code, else of its innermost Python frame."""
    frames = list(enumerate(stack.frames))
    python = [(i, f) for i, f in frames if not f.native]
    own = [(i, f) for i, f in python if _own(f)]
    return (own or python or frames)[-1][0]


def place_of(stack: ThreadStack | None) -> str:
    """Where a thread is: its innermost frame of the user's own code, else its innermost Python frame."""
    if stack is None or not stack.frames:
        return "no Python frame"
    return stack.frames[_place_index(stack)].where


def verdict_frames(stack: ThreadStack) -> set[int]:
    """The indices of the frames a verdict may name: shown whole on the console, never folded."""
    if not stack.frames:
        return set()
    collective = _collective_index(stack)
    return {_place_index(stack), *(() if collective is None else (collective,))}


@dataclass(frozen=True)
class Spot:
    """Where the main threads of some ranks are: the collective they wait in (None: in none) and their
    place. Ranks whose other threads differ (an engine's, a loader's) are at one spot all the same."""

    ranks: tuple[int, ...]
    collective: str | None
    where: str


def spots(groups: Sequence[Group]) -> list[Spot]:
    """The readable groups' ranks by their main thread's Python frames (whatever their other threads do):
    fewest ranks first, then by lowest rank."""
    by_main: dict[tuple[Frame, ...], tuple[ThreadStack | None, list[int]]] = {}
    for group in groups:
        if not group.error:
            main = group.sample.main_stack
            key = () if main is None else tuple(f for f in main.frames if not f.native)
            by_main.setdefault(key, (main, []))[1].extend(group.ranks)
    found = [
        Spot(tuple(sorted(ranks)), collective_of(main), place_of(main)) for main, ranks in by_main.values()
    ]
    return sorted(found, key=lambda s: (len(s.ranks), s.ranks[0]))


def verdict(groups: Sequence[Group], world_size: int) -> str:
    """One line: which ranks wait in a collective and which are not in one, and where (their main
    thread's innermost frame of their own code); the same state gives the same line."""
    unreadable = sum(len(g.ranks) for g in groups if g.error)
    tail = f"; {plural(unreadable, 'rank', 'ranks')} could not be read" if unreadable else ""
    legible = [g for g in groups if not g.error]
    cut = sorted(r for g in legible if any(t.truncated for t in g.sample.threads) for r in g.ranks)
    if cut:
        # Ranks that recurse from different callers look alike within faulthandler's innermost frames.
        tail += f"; {ranks_label(cut)}: stacks cut at {CUT_AT} frames, they may differ further out"
    if not legible:
        return f"no rank's stack could be read ({plural(world_size, 'rank', 'ranks')})"
    found = spots(legible)
    waiting = [s for s in found if s.collective]
    elsewhere = [s for s in found if not s.collective]
    if waiting and elsewhere:
        count = sum(len(s.ranks) for s in waiting)
        names = ", ".join(dict.fromkeys(str(s.collective) for s in waiting))
        others = sorted(r for s in elsewhere for r in s.ranks)
        verb = "is" if len(others) == 1 else "are"
        places = "; ".join(
            f"in {s.where}" if len(elsewhere) == 1 else f"{ranks_label(s.ranks)} in {s.where}"
            for s in elsewhere
        )
        head = f"{plural(count, 'rank waits', 'ranks wait')} in a collective ({names})"
        return f"{head}; {ranks_label(others)} {verb} elsewhere: {places}{tail}"
    if len(found) == 1:
        spot = found[0]
        if len(spot.ranks) == 1:
            what = f"{ranks_label(spot.ranks)} is"
            if spot.collective:
                return f"{what} in a collective ({spot.collective}) at {spot.where}{tail}"
            return f"{what} not in a collective: in {spot.where}{tail}"
        what = "both ranks" if len(spot.ranks) == 2 else f"all {len(spot.ranks)} ranks"
        if spot.collective:
            return f"{what} wait in the same collective ({spot.collective}) at {spot.where}{tail}"
        return f"{what} are at the same place, not in a collective: in {spot.where}{tail}"
    odd = found[0]
    if waiting:
        return (
            f"the ranks are in {len(found)} different collectives; the fewest, {ranks_label(odd.ranks)}, "
            f"in {odd.collective} at {odd.where}{tail}"
        )
    return (
        f"the ranks are in {len(found)} different places, none in a collective; the fewest, "
        f"{ranks_label(odd.ranks)}, in {odd.where}{tail}"
    )


def _thread_lines(thread: ThreadStack, full: bool, verdicts: bool) -> list[str]:
    """`verdicts`: the thread is the one the verdict reads (its frames the verdict names stay whole)."""
    frames = thread.frames
    if full:
        return [frame.text() for frame in frames]
    keep = verdict_frames(thread) if verdicts else set()
    shown = readable([f.file for f in frames], [f.func for f in frames], [f.native for f in frames], keep)
    return [
        line.mark if line.frame is None else frames[line.frame].text(short=line.frame not in keep)
        for line in shown
    ]


def _thread_order(thread: ThreadStack) -> tuple[Any, ...]:
    return (not thread.main, thread.name, thread.frames, thread.truncated, thread.others_unread)


def shown_threads(stacks: RankStacks) -> list[ThreadStack]:
    """A rank's threads in the order shown: the main thread first, then the others by name and frames,
    however the stack tool listed them."""
    return sorted(stacks.threads, key=_thread_order)


def thread_json(thread: ThreadStack) -> dict[str, Any]:
    """A thread in the report's form (docs/report.schema.json, `stacks`)."""
    return {
        "name": thread.name,
        "main": thread.main,
        **({"truncated": True} if thread.truncated else {}),
        **({"others_unread": True} if thread.others_unread else {}),
        "frames": [
            {"function": f.func, "file": f.file, "line": f.line, "native": f.native} for f in thread.frames
        ],
    }


def group_json(
    ranks: Iterable[int], hosts: Iterable[str], read: RankStacks, threads: Iterable[ThreadStack]
) -> dict[str, Any]:
    """Ranks that share `read`'s stacks, in the report's form (`threads` in the order shown)."""
    return {
        "ranks": list(ranks),
        "hosts": list(hosts),
        "error": read.error or None,
        "source": read.source or None,
        "threads": [thread_json(t) for t in threads],
    }


@dataclass(frozen=True)
class StackDump:
    """One gathering of every rank's stacks: why (`timeout`, `stall`, `request`), when, and what came back."""

    reason: str
    time: float  # time.time()
    world_size: int
    groups: tuple[Group, ...]
    # Every rank's latest collectives, where kept: the verdict names the ranks behind from them.
    collectives: tuple[RankProgress, ...] = ()

    @classmethod
    def of(cls, reason: str, time: float, world_size: int, stacks: Iterable[RankStacks]) -> StackDump:
        read = list(stacks)
        records = tuple(r for rank in sorted(read, key=lambda s: s.rank) for r in rank.collectives)
        return cls(reason, time, world_size, tuple(group_stacks(read)), records)

    @property
    def verdict(self) -> str:
        found = self.collective_verdict() or verdict(self.groups, self.world_size)
        moving = sorted({r.process_set for r in self.collectives if r.moving})
        if moving:
            # A busy job's ranks are read at moments apart, so where they are differs: say it is not a stall.
            sets = ", ".join(map(str, moving))
            found += f"; collectives moving (process set {sets}): on their way, not stalled"
        return found

    def collective_verdict(self) -> str | None:
        """The verdict from the ranks' collectives (collective_verdict), None where they tell nothing."""
        if not self.collectives:
            return None
        by_rank: dict[int, list[RankProgress]] = {}
        for record in self.collectives:
            by_rank.setdefault(record.rank, []).append(record)
        places = {rank: place_of(g.sample.main_stack) for g in self.groups if not g.error for rank in g.ranks}
        return collective_verdict(by_rank, range(self.world_size), places)

    def _collective_lines(self, group: Group) -> list[str]:
        """Beside a group's stacks: its ranks' last collective issued and completed (one line when alike)."""
        texts = {rank: progress_line([r for r in self.collectives if r.rank == rank]) for rank in group.ranks}
        shown = {rank: text for rank, text in texts.items() if text}
        if not shown:
            return []
        if len(set(shown.values())) == 1 and len(shown) == len(group.ranks):
            return [f"  collectives: {next(iter(shown.values()))}"]
        return [f"  collectives of rank {rank}: {text}" for rank, text in shown.items()]

    def lines(self, full: bool = False) -> list[str]:
        """What a person reads: each group's threads made readable (`readable`), the verdict's frames whole;
        `full`: every frame as read, for --output-dir."""
        out: list[str] = []
        for group in self.groups:
            hosts = ", ".join(group.hosts)
            head = f"{ranks_label(group.ranks)} ({len(group.ranks)} of {self.world_size}) on {hosts}"
            if group.error:
                out.append(f"{head}: cannot read the stacks: {group.error}")
                out.extend(self._collective_lines(group))
                continue
            out.append(f"{head}:")
            out.extend(self._collective_lines(group))
            threads = shown_threads(group.sample)
            for index, thread in enumerate(threads):
                name = "main thread" if thread.main else thread.name or f"thread {index + 1}"
                out.append(f"  {name}:")
                if thread.truncated:
                    out.append(f"    ... outer frames not read (faulthandler stops at {CUT_AT})")
                lines = _thread_lines(thread, full, thread is group.sample.main_stack)
                out.extend(f"    {line}" for line in lines)
                if not thread.frames:
                    out.append("    (no Python frame)")
                if thread.others_unread:
                    out.append(f"  other threads: {OTHERS_UNREAD}")
        out.append(f"verdict: {self.verdict}")
        return out

    def to_json(self) -> dict[str, Any]:
        """The report's form (docs/report.schema.json, `stacks`)."""
        return {
            "reason": self.reason,
            "time": self.time,
            "verdict": self.verdict,
            **({"collectives": [record_json(r) for r in self.collectives]} if self.collectives else {}),
            "groups": [group_json(g.ranks, g.hosts, g.sample, shown_threads(g.sample)) for g in self.groups],
        }
