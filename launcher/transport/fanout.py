"""One piece of work per host, run on threads within a `Window`, and every host's outcome collected.

`fan_out` returns a `GroupResult`, as fabric's Group does: host -> value or error, in the order the hosts were
given. Two policies on top of it:
  all_or_nothing  a launch: the first failure stops hosts not started yet and the retries in flight, every
                  value already made is closed, and one error is raised, the first failing host's in the
                  order given (a HostError says how many more failed)
  keep_going      `distrun check`: a host's own failure (HostError) is its outcome and the others go on;
                  anything else (bad input, a bug) is no one host's and ends it as all_or_nothing would
`opening` keeps the all-or-nothing promise for values made one at a time on the calling thread (local agents:
forking from a thread is not safe).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import NoReturn, TypeVar

from launcher.errors import HostError
from launcher.progress import Progress, ProgressFn
from launcher.transport.window import Aborted, Window

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


def fan_out(
    names: Sequence[str],
    work: Callable[[str, Window], T],
    close: Callable[[T], None],
    *,
    limit: int,
    phase: str,
    stop_on: Callable[[BaseException], bool],
    progress: ProgressFn | None = None,
    threads: int | None = None,
) -> GroupResult[T]:
    """`work(name, window)` for every (distinct) name, at most `limit` at once (`threads` workers, `limit` by
    default: more where `work` holds a window slot for only part of its time).

    A failure that `stop_on` says ends the fan-out aborts the window: hosts not started yet are skipped and
    retries in flight give up. `progress` hears how far it got after every host. Interrupted while waiting
    (Ctrl-C), it closes every value made so far with `close` before raising.
    """
    import queue  # only where threads fan out: a launch on this machine never needs it

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
                if stop_on(exc):
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
    return GroupResult((name, values[name] if name in values else errors[name]) for name in names)


def all_or_nothing(
    names: Sequence[str],
    work: Callable[[str, Window], T],
    close: Callable[[T], None],
    *,
    limit: int,
    phase: str,
    progress: ProgressFn | None = None,
    threads: int | None = None,
) -> dict[str, T]:
    """Every name's value in `names` order; else every value made is closed and the first failure raised."""
    started = time.monotonic()
    group = fan_out(
        names,
        work,
        close,
        limit=limit,
        phase=phase,
        stop_on=_always,
        progress=progress,
        threads=threads,
    )
    if group.failed:
        _close_and_raise(group, group.failed, close)
    log.debug("%s: %d host(s) in %.2fs", phase, len(group), time.monotonic() - started)
    return dict(group.succeeded)


def keep_going(
    names: Sequence[str],
    work: Callable[[str, Window], T],
    close: Callable[[T], None],
    *,
    limit: int,
    phase: str,
    progress: ProgressFn | None = None,
    threads: int | None = None,
) -> GroupResult[T]:
    """Every host's outcome, its own failures (HostError) included; anything else is raised (see above)."""

    def fatal(exc: BaseException) -> bool:
        return not isinstance(exc, HostError)

    group = fan_out(
        names, work, close, limit=limit, phase=phase, stop_on=fatal, progress=progress, threads=threads
    )
    worst = {name: exc for name, exc in group.failed.items() if fatal(exc)}
    if worst:
        _close_and_raise(group, worst, close)
    return group


def _always(exc: BaseException) -> bool:
    return True


def _close_and_raise(
    group: GroupResult[T], failed: Mapping[str, BaseException], close: Callable[[T], None]
) -> NoReturn:
    for value in group.succeeded.values():
        close(value)
    exc = next(iter(failed.values()))
    if isinstance(exc, HostError) and len(failed) > 1:
        raise HostError(f"{exc} (and {len(failed) - 1} more host(s) failed)", host=exc.host) from exc
    raise exc


@contextlib.contextmanager
def opening(close: Callable[[T], None]) -> Iterator[dict[str, T]]:
    """A dict to put each host's value in as it is made; if the block raises, every value in it is closed."""
    made: dict[str, T] = {}
    try:
        yield made
    except BaseException:
        for value in made.values():
            close(value)
        raise
