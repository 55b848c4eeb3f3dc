"""No failure of a diagnosis path ends the job (issue 38, item 1), in-process: the supervisor with a JobWatch
whose grouping, verdict, live view or an agent's answer fails, and the agent's readers and sampler with
their steps failing. The same with real jobs: tests/integration/test_stacks_isolation.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from launcher.agent import stackdump
from launcher.agent.protocol import Samples
from launcher.agent.sampling import Sampler
from launcher.agent.stackdump import DumpDir, Gathering
from launcher.core.result import TimedOut
from launcher.diagnose import live, stacks
from launcher.diagnose.isolation import Isolation
from launcher.diagnose.raw_dump import RawDump
from tests.unit.watch_support import FRAMES, reply, watched

Raise = pytest.MonkeyPatch


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "launcher.diagnose.isolation"]


def _boom(*_: object, **__: object) -> None:
    raise RuntimeError("injected\nover two lines")


def test_a_verdict_that_raises_still_times_out_with_the_stacks_as_read(
    monkeypatch: Raise, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stacks, "verdict", _boom)
    hosts, sup, watch = watched(timeout=5.0)
    sup.on_tick(5.0)
    for host, ranks in ((hosts[0], (0, 1)), (hosts[1], (2,))):
        reply(sup, host, [{"rank": r, "threads": [{"main": True, "frames": FRAMES}]} for r in ranks], 5.5)
    assert sup.outcome() == TimedOut(5.0, (0, 1, 2))
    dump = watch.dumps[0]
    assert isinstance(dump, RawDump)
    failure = "distrun stacks' grouping failed: RuntimeError: injected over two lines"
    assert dump.verdict == f"none ({failure})"
    lines = dump.lines()
    assert lines[:3] == ["rank 0 on h1:", "  main thread:", '    File "/job/train.py", line 3, in <module>']
    assert [g["ranks"] for g in dump.to_json()["groups"]] == [[0], [1], [2]]
    assert _said(caplog) == [f"{failure}; the job runs on"]


def test_a_garbled_answer_names_that_hosts_ranks_and_the_others_are_grouped() -> None:
    hosts, sup, watch = watched(timeout=5.0)
    sup.on_tick(5.0)
    reply(sup, hosts[0], [{"rank": 0, "threads": [{"frames": [["f", "x.py", "not a line"]]}]}], 5.5)
    reply(sup, hosts[1], [{"rank": 2, "threads": [{"main": True, "frames": FRAMES}]}], 6.0)
    assert isinstance(sup.outcome(), TimedOut)
    groups = [(g.ranks, g.error) for g in watch.dumps[0].groups]
    assert groups == [
        ((2,), ""),
        ((0, 1), "its agent's answer could not be read: ValueError: invalid literal for int() with base 10: "
         "'not a line'"),
    ]  # fmt: skip


def test_distrun_top_answers_with_the_error_where_the_live_view_fails(
    monkeypatch: Raise, caplog: pytest.LogCaptureFixture
) -> None:
    _, sup, watch = watched(timeout=50.0)
    monkeypatch.setattr(live.LiveView, "answer", _boom)
    monkeypatch.setattr(live.LiveView, "on_samples", _boom)
    watch.on_samples(Samples(1.0), 1.0, "h1")
    watch.on_samples(Samples(1.0, error="sampling failed: OSError: gone"), 2.0, "h2")
    document = json.loads(watch.answer_top("running its ranks"))
    assert document == {
        "pid": os.getpid(),
        "doing": "running its ranks",
        "ranks": [],
        "error": "distrun top's live view failed: RuntimeError: injected over two lines",
    }
    assert watch.samples_of_attempt() == {}
    assert _said(caplog) == [
        "distrun top's live view failed: RuntimeError: injected over two lines; the job runs on",
        "distrun top's live view on host h2: sampling failed: OSError: gone; the job runs on",
    ]
    assert sup.cause is None


def test_an_error_is_said_once_however_often_it_comes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    isolation = Isolation()
    for _ in range(3):
        with isolation.guard("the straggler watch"):
            raise KeyError("rank")
    assert len(_said(caplog)) == 1 and isolation.said == ["the straggler watch failed: KeyError: 'rank'"]


def test_a_reader_step_that_raises_names_its_rank_and_the_others_are_read(
    monkeypatch: Raise, tmp_path: Path
) -> None:
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    dump_dir = DumpDir()
    try:
        real = stackdump.unreadable_state
        monkeypatch.setattr(
            stackdump, "unreadable_state", lambda pid: _boom() if pid == 2**22 + 1 else real(pid)
        )
        gathering = Gathering(1, {0: os.getpid(), 1: 2**22 + 1}, dump_dir, tool="python", wait=0.1, now=0.0)
        while not gathering.poll(1.0):
            pass
        results = {r["rank"]: r for r in gathering.results()}
        assert results[1]["error"] == "reading its stacks failed: RuntimeError: injected over two lines"
        assert "error" in results[0] and "failed" not in results[0]["error"]  # this test has no hook
    finally:
        dump_dir.remove()


def test_sampling_that_raises_becomes_a_samples_frame_saying_it(monkeypatch: Raise) -> None:
    sampler = Sampler(2.0, 0.0)
    monkeypatch.setattr("launcher.agent.sampling.tree", _boom)
    taken = sampler.take({0: os.getpid()}, 0.0)
    assert taken == Samples(2.0, error="sampling failed: RuntimeError: injected over two lines")
    assert sampler.next_at == 2.0
