"""The agent as a real process, shipped the way remote hosts get it: one agent serves several attempts."""

from __future__ import annotations

import os
import subprocess
import sys

from launcher.protocol import (
    DONE,
    EXIT,
    FACTS,
    HELLO,
    OUT,
    PROBE,
    START,
    VERSION,
    Facts,
    FrameReader,
    Hello,
    ProbeRequest,
    RankExited,
    RankSpec,
    StartRequest,
    decode_message,
    encode_message,
)
from tests.support import start_shipped_agent


def _read_until(
    proc: subprocess.Popen[bytes], reader: FrameReader, kind: int
) -> list[tuple[int, int, bytes]]:
    assert proc.stdout is not None
    frames: list[tuple[int, int, bytes]] = []
    while not any(f[0] == kind for f in frames):
        data = os.read(proc.stdout.fileno(), 65536)
        assert data, f"agent closed its output early; stderr: {proc.stderr.read() if proc.stderr else ''!r}"
        frames.extend(reader.feed(data))
    return frames


def test_shipped_agent_answers_probes_and_runs_two_attempts_then_exits_at_eof() -> None:
    proc = start_shipped_agent()
    assert proc.stdin is not None
    reader = FrameReader(after_magic=True)
    proc.stdin.write(encode_message(PROBE, ProbeRequest(ports=2, cwd="/")))
    proc.stdin.flush()
    frames = _read_until(proc, reader, FACTS)
    assert decode_message(Hello, frames[0][2]) == Hello(VERSION, proc.pid) and frames[0][0] == HELLO
    facts = decode_message(Facts, frames[-1][2])
    assert facts.cwd_exists and len(set(facts.free_ports)) == 2
    for attempt, code in enumerate((3, 0)):
        script = f"print('attempt {attempt}'); raise SystemExit({code})"
        spec = StartRequest("/", 1.0, [RankSpec(0, [sys.executable, "-c", script], {})])
        proc.stdin.write(encode_message(START, spec))
        proc.stdin.flush()
        frames = _read_until(proc, reader, DONE)
        assert (OUT, 0, f"attempt {attempt}\n".encode()) in frames
        exits = [decode_message(RankExited, p) for k, _, p in frames if k == EXIT]
        assert exits == [RankExited(code)]
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
