"""The fan-out (launcher.backends.fanout) in-process: GroupResult, both policies, `opening`.

Work functions are fakes that return `FakeLink`s or raise, on the fan-out's own threads; no processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from launcher.backends.fanout import ALL_OR_NOTHING, KEEP_GOING, GroupResult, Policy, fan_out
from launcher.backends.link import opening
from launcher.backends.window import Aborted, Window
from launcher.core.progress import Progress, ProgressFn
from launcher.errors import HostError, UsageError


class FakeLink:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Fake:
    """A connect function: hosts in `failing` raise what it maps them to; every link made is kept to check
    what was closed. With `together`, every host waits for the others first, so none is skipped."""

    def __init__(self, failing: Mapping[str, Exception] | None = None, together: int = 0) -> None:
        self.failing = dict(failing or {})
        self.made: list[FakeLink] = []
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(together, timeout=10) if together else None

    def __call__(self, name: str, window: Window) -> FakeLink:
        with self._lock:
            self.started.append(name)
        if self._barrier is not None:
            self._barrier.wait()
        if name in self.failing:
            raise self.failing[name]
        link = FakeLink(name)
        with self._lock:
            self.made.append(link)
        return link

    def closed(self) -> list[str]:
        return sorted(link.name for link in self.made if link.closed)


def run(
    names: list[str],
    work: Fake | Callable[[str, Window], FakeLink],
    policy: Policy,
    limit: int,
    progress: ProgressFn | None = None,
) -> GroupResult[FakeLink]:
    return fan_out(
        names, work, FakeLink.close, policy=policy, limit=limit, phase="connecting", progress=progress
    )


REFUSED = HostError("b: connection refused", host="b")
ALSO = HostError("d: no route to host", host="d")
BAD_CONFIG = UsageError("cannot read ssh config ~/.ssh/config: bad line")


@pytest.mark.parametrize(
    ("outcomes", "succeeded", "failed", "skipped"),
    [
        ([], [], [], []),
        ([("c", 1), ("a", 2)], ["c", "a"], [], []),
        ([("a", 1), ("b", REFUSED), ("c", Aborted())], ["a"], ["b"], ["c"]),
        ([("d", ALSO), ("b", REFUSED)], [], ["d", "b"], []),  # in the order given, not by name
        ([("x", Aborted()), ("y", Aborted())], [], [], ["x", "y"]),
    ],
)
def test_group_result_sorts_outcomes(
    outcomes: list[tuple[str, Any]], succeeded: list[str], failed: list[str], skipped: list[str]
) -> None:
    group: GroupResult[Any] = GroupResult(outcomes)
    assert list(group) == [name for name, _ in outcomes] and len(group) == len(outcomes)
    assert list(group.succeeded) == succeeded
    assert list(group.failed) == failed
    assert list(group.skipped) == skipped
    assert all(group[name] is outcome for name, outcome in outcomes)


def test_group_result_is_immutable() -> None:
    group = GroupResult([("a", 1), ("b", REFUSED)])
    with pytest.raises(TypeError):
        group["a"] = 2  # type: ignore[index]
    with pytest.raises(TypeError):
        group.succeeded["b"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        group.extra = 1  # type: ignore[attr-defined]
    assert dict(group) == {"a": 1, "b": REFUSED}


@pytest.mark.parametrize(
    ("failing", "message"),
    [
        ({}, None),
        ({"b": REFUSED}, r"^b: connection refused$"),
        # The first failing host in the order given, whichever failed first; how many more failed.
        ({"d": ALSO, "b": REFUSED}, r"^b: connection refused \(and 1 more host\(s\) failed\)$"),
        # Bad input is no host's failure: raised as it is.
        ({"c": BAD_CONFIG}, r"^cannot read ssh config"),
    ],
)
def test_all_or_nothing_returns_every_link_or_one_error(
    failing: dict[str, Exception], message: str | None
) -> None:
    connect = Fake(failing, together=4)
    names = ["a", "b", "c", "d"]
    if message is None:
        links = run(names, connect, ALL_OR_NOTHING, 4)
        assert list(links) == names and [link.name for link in links.succeeded.values()] == names
        assert connect.closed() == []
        return
    with pytest.raises(type(next(iter(failing.values()))), match=message):
        run(names, connect, ALL_OR_NOTHING, 4)
    assert connect.closed() == sorted(set(names) - set(failing))  # every link already made is closed


def test_all_or_nothing_skips_hosts_not_started_yet() -> None:
    connect = Fake({"a": HostError("a: connection refused", host="a")})
    with pytest.raises(HostError, match=r"^a: connection refused$"):
        run([*"abcdefghij"], connect, ALL_OR_NOTHING, 1)
    assert len(connect.started) < 10


def test_all_or_nothing_keeps_to_its_window_and_reports_progress() -> None:
    lock = threading.Lock()
    in_flight, peak = 0, 0
    seen: list[Progress] = []

    def connect(name: str, window: Window) -> FakeLink:
        nonlocal in_flight, peak
        with window.slot():
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.001)  # let other workers pile up against the window
            with lock:
                in_flight -= 1
        if name == "x":
            raise HostError("x: connection refused", host="x")
        return FakeLink(name)

    names = [f"h{i}" for i in range(40)]
    links = run(names, connect, ALL_OR_NOTHING, 5, seen.append)
    assert len(links) == 40
    assert 1 <= peak <= 5
    assert seen[0] == Progress("connecting", 40) and seen[-1] == Progress("connecting", 40, 40)
    assert [p.done for p in seen] == list(range(41))  # one report per host, from one thread, in order

    seen.clear()
    with pytest.raises(HostError, match=r"^x: connection refused"):
        run(["a", "x"], connect, ALL_OR_NOTHING, 1, seen.append)
    assert seen[-1].failed == 1
    assert str(seen[-1]) in ("connecting 1/2 hosts, 1 failed", "connecting 0/2 hosts, 1 failed")


@pytest.mark.parametrize(
    ("failing", "failed"),
    [
        ({}, []),
        ({"b": REFUSED}, ["b"]),
        ({"d": ALSO, "b": REFUSED}, ["b", "d"]),
    ],
)
def test_keep_going_reports_every_hosts_own_outcome(failing: dict[str, Exception], failed: list[str]) -> None:
    connect = Fake(failing)
    names = ["a", "b", "c", "d"]
    group = run(names, connect, KEEP_GOING, 1)
    assert list(group) == names
    assert list(group.failed) == failed and all(group[n] is failing[n] for n in failed)
    assert list(group.succeeded) == [n for n in names if n not in failing]
    assert group.skipped == () and connect.started == names  # with one at a time: every host, in order
    assert connect.closed() == []  # the caller owns every link


def test_keep_going_stops_at_what_is_no_hosts_own_failure() -> None:
    connect = Fake({"b": BAD_CONFIG})
    with pytest.raises(UsageError, match=r"^cannot read ssh config"):
        run([*"abcdefghij"], connect, KEEP_GOING, 1)
    assert connect.started[:2] == ["a", "b"] and len(connect.started) < 10
    assert connect.closed() == ["a"]


@pytest.mark.parametrize("policy", [ALL_OR_NOTHING, KEEP_GOING])
def test_an_interrupted_wait_closes_what_was_made(policy: Policy) -> None:
    connect = Fake()

    def interrupt(progress: Progress) -> None:
        if progress.done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fan_out(
            [*"abcd"], connect, FakeLink.close, policy=policy, limit=1, phase="connecting", progress=interrupt
        )
    assert connect.closed()[:2] == ["a", "b"]


def test_opening_closes_everything_made_when_the_block_fails() -> None:
    made: list[FakeLink] = []
    with pytest.raises(OSError, match="fork failed"), opening(FakeLink.close) as links:
        for name in "abc":
            if name == "c":
                raise OSError("fork failed")
            links[name] = FakeLink(name)
            made.append(links[name])
    assert [link.closed for link in made] == [True, True]

    with opening(FakeLink.close) as links:
        links["a"] = FakeLink("a")
    assert not links["a"].closed
