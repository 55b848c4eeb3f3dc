"""The shipped agent reports its cores and pins ranks to the cpus of their START spec (real processes)."""

from __future__ import annotations

import os
import sys

from launcher.agent.protocol import (
    DONE,
    ERR,
    EXIT,
    FACTS,
    OUT,
    PROBE,
    START,
    Facts,
    FrameReader,
    ProbeRequest,
    RankExited,
    RankSpec,
    StartRequest,
    decode_message,
    encode_message,
)
from tests.support import read_frames_until, start_shipped_agent

AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


def test_ranks_run_on_their_cpus_and_an_impossible_set_fails_to_start_clearly() -> None:
    proc = start_shipped_agent()
    assert proc.stdin is not None
    reader = FrameReader(after_magic=True)
    proc.stdin.write(encode_message(PROBE, ProbeRequest(ports=0, cwd="/")))
    proc.stdin.flush()
    facts = decode_message(Facts, read_frames_until(proc, reader, FACTS)[-1].payload)
    allowed = sorted(os.sched_getaffinity(0))
    assert facts.devices["cores"] == allowed
    last = allowed[-1]
    ranks = [
        RankSpec(0, [sys.executable, "-c", AFFINITY], {}, cpus=[last]),
        RankSpec(1, [sys.executable, "-c", AFFINITY], {}),
        RankSpec(2, [sys.executable, "-c", AFFINITY], {}, cpus=[100_000]),
    ]
    proc.stdin.write(encode_message(START, StartRequest("/", 1.0, ranks)))
    proc.stdin.flush()
    frames = read_frames_until(proc, reader, DONE)
    assert (OUT, 0, 0, f"[{last}]\n".encode()) in frames
    assert (OUT, 0, 1, f"{allowed}\n".encode()) in frames  # no cpus: left as the agent is
    errors = [f.payload.decode() for f in frames if f.kind == ERR and f.rank == 2]
    assert len(errors) == 1 and errors[0].endswith(": cannot pin it to cores [100000]\n"), errors
    exits = {f.rank: decode_message(RankExited, f.payload).returncode for f in frames if f.kind == EXIT}
    assert exits == {0: 0, 1: 0, 2: 126}
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
