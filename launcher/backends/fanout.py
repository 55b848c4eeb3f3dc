"""One piece of work per host, run on threads within a `Window`, and every host's outcome collected.

`fan_out` returns a `GroupResult`, as fabric's Group does: host -> value or error, in the order the hosts were
given. Its `Policy` says which failures end the whole fan-out; those abort the window (hosts not started yet
are skipped, retries in flight give up), every value already made is closed, and one error is raised, the
first such host's in the order given (a HostError says how many more failed):
  ALL_OR_NOTHING  a launch: every failure ends it, so what comes back holds a value for every host
  KEEP_GOING      `distrun check`: a host's own failure (HostError) is its outcome and the others go on;
                  anything else (bad input, a bug) is no one host's, and ends it
Values made one at a time on the calling thread keep the all-or-nothing promise with
`launcher.backends.link.opening`, which this module uses too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from launcher.backends.link import opening
from launcher.backends.window import Aborted, Window
from launcher.core.progress import Progress, ProgressFn
from launcher.errors import HostError

log = logging.getLogger(__name__)

T = TypeVar("T")


class GroupResult(Mapping[str, T | BaseException]):
    """Host -> the value its work returned, or the exception it raised; immutable, in the order the hosts were
    given. A host skipped because another failed first maps to `Aborted` and is in `skipped`, not `failed`.
    Values are never exceptions."""

    __slots__ = ("_outcomes",)

    def __init__(self, outcomes: Iterable[tuple[str, T | BaseException]]) -> None:
        self._outcomes: Mapping[str, T | BaseException] = MappingProxyType(dict(outcomes))

    def __getitem__(self, host: str) -> T | BaseException:
        return self._outcomes[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outcomes)

    def __len__(self) -> int:
        return len(self._outcomes)

    def __repr__(self) -> str:
        return f"GroupResult({dict(self._outcomes)!r})"

    @property
    def succeeded(self) -> Mapping[str, T]:
        return MappingProxyType({h: v for h, v in self._outcomes.items() if not isinstance(v, BaseException)})

    @property
    def failed(self) -> Mapping[str, BaseException]:
        return MappingProxyType(
            {
                h: v
                for h, v in self._outcomes.items()
                if isinstance(v, BaseException) and not isinstance(v, Aborted)
            }
        )

    @property
    def skipped(self) -> tuple[str, ...]:
        return tuple(h for h, v in self._outcomes.items() if isinstance(v, Aborted))


@dataclass(frozen=True)
class Policy:
    """Which failures end a fan-out (see the module's docstring)."""

    name: str
    ends: Callable[[BaseException], bool]


ALL_OR_NOTHING = Policy("all or nothing", lambda exc: True)
KEEP_GOING = Policy("keep going", lambda exc: not isinstance(exc, HostError))


def fan_out(
    names: Sequence[str],
    work: Callable[[str, Window], T],
    close: Callable[[T], None],
    *,
    policy: Policy,
    limit: int,
    phase: str,
    progress: ProgressFn | None = None,
    threads: int | None = None,
) -> GroupResult[T]:
    """`work(name, window)` for every (distinct) name, at most `limit` at once (`threads` workers, `limit` by
    default: more where `work` holds a window slot for only part of its time); `progress` hears how far it
    got after every host.

    Values are the caller's to close once returned; on a failure that `policy` says ends the fan-out, or
    when interrupted while waiting (Ctrl-C), every value made is closed with `close` before raising.
    """
    import queue  # only where threads fan out: a launch on this machine never needs it

    started = time.monotonic()
    window = Window(limit)
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for name in names:
        todo.put(name)
    outcomes: queue.SimpleQueue[tuple[str, T | BaseException]] = queue.SimpleQueue()

    def worker() -> None:
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            try:
                if window.aborted.is_set():
                    raise Aborted
                outcomes.put((name, work(name, window)))
            except Aborted as exc:
                outcomes.put((name, exc))  # another host failed first: never finished
            except BaseException as exc:
                if policy.ends(exc):
                    window.abort()
                outcomes.put((name, exc))

    # Daemon threads, so Ctrl-C need not wait for a handshake with a dead host to time out.
    for i in range(max(1, min(threads or limit, len(names)))):
        threading.Thread(target=worker, name=f"{phase}-{i}", daemon=True).start()
    errors: dict[str, BaseException] = {}
    with opening(close) as values:
        try:
            if progress is not None:
                progress(Progress(phase, len(names)))
            for _ in names:
                name, outcome = outcomes.get()
                if not isinstance(outcome, BaseException):
                    values[name] = outcome
                else:
                    errors[name] = outcome
                if progress is not None:
                    failed = sum(not isinstance(e, Aborted) for e in errors.values())
                    progress(Progress(phase, len(names), len(values), failed, name))
        except BaseException:
            window.abort()
            raise
        group = GroupResult((name, values[name] if name in values else errors[name]) for name in names)
        ending = [exc for exc in group.failed.values() if policy.ends(exc)]
        if ending:
            first = ending[0]
            if isinstance(first, HostError) and len(ending) > 1:
                raise HostError(
                    f"{first} (and {len(ending) - 1} more host(s) failed)", host=first.host
                ) from first
            raise first
    log.debug("%s: %d host(s) in %.2fs (%s)", phase, len(group), time.monotonic() - started, policy.name)
    return group
