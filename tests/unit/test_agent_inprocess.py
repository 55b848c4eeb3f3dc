"""The agent in this process: a fake clock and a fake process starter, frames over real pipes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from launcher.agent.protocol import (
    FACTS,
    PROBE,
    START,
    Facts,
    FrameReader,
    ProbeRequest,
    RankSpec,
    StartRequest,
    decode_message,
    encode,
    encode_message,
)
from launcher.agent.server import Agent


class FakeRank:
    """What Agent needs of a Popen: a pid and two readable pipes. It never runs anything."""

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.argv = argv
        self.env: dict[str, str] = kwargs["env"]
        self.pid = 0
        self.returncode: int | None = None
        out_r, self._out_w = os.pipe()
        err_r, self._err_w = os.pipe()
        self.stdout = open(out_r, "rb")  # noqa: SIM115 - the agent closes them
        self.stderr = open(err_r, "rb")  # noqa: SIM115

    def close(self) -> None:
        for f in (self.stdout, self.stderr):
            f.close()
        os.close(self._out_w)
        os.close(self._err_w)


# The agent, the write end of its input, the read end of its output, the ranks it started.
Harness = tuple[Agent, int, int, list[FakeRank]]


@pytest.fixture
def agent() -> Iterator[Harness]:
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    started: list[FakeRank] = []

    def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(FakeRank(argv, **kwargs))
        return started[-1]  # type: ignore[return-value]

    yield Agent(in_r, out_w, clock=lambda: 100.0, start_process=start), in_w, out_r, started
    for rank in started:
        rank.close()
    for fd in (in_r, in_w, out_r, out_w):
        os.close(fd)


def test_start_composes_each_rank_s_environment_once(agent: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # the host's own: a default does not replace it
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "outer-job")  # a leftover: removed
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    the_agent, in_w, _, started = agent
    rank = RankSpec(0, ["train"], {"RANK": "0"}, {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    request = StartRequest("/", 1.0, [rank], env={"SHARED": "yes"}, unset_prefixes=["TORCHELASTIC_"])
    os.write(in_w, encode(99, agent=4) + encode_message(START, request, agent=4))
    assert the_agent._read_control()
    [proc] = started
    assert proc.argv == ["train"]
    assert (proc.env["RANK"], proc.env["SHARED"], proc.env["OMP_NUM_THREADS"]) == ("0", "yes", "8")
    assert proc.env["PYTHONUNBUFFERED"] == "1" and "TORCHELASTIC_RUN_ID" not in proc.env
    assert the_agent.ranks[0].started == 100.0  # the injected clock
    assert the_agent.agent_id == 4


def test_probe_is_answered_with_the_launcher_s_agent_id(
    agent: Harness,
) -> None:
    the_agent, in_w, out_r, _ = agent
    os.write(in_w, encode_message(PROBE, ProbeRequest(ports=1, cwd="/"), agent=9))
    assert the_agent._read_control()
    [frame] = FrameReader().feed(os.read(out_r, 1 << 20))
    assert (frame.kind, frame.agent) == (FACTS, 9)
    facts = decode_message(Facts, frame.payload)
    assert facts.cwd_exists and len(facts.free_ports) == 1
