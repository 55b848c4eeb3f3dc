"""The agent as a real process, shipped the way remote hosts get it: one agent serves several attempts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

from launcher.agent.protocol import (
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
    encode,
    encode_message,
)
from tests.support import read_frames_until, start_shipped_agent


def _agent(**env: str) -> tuple[subprocess.Popen[bytes], FrameReader]:
    """The shipped agent, with `env` besides PATH in its (the host's) environment."""
    return start_shipped_agent(**env), FrameReader(after_magic=True)


def test_shipped_agent_answers_probes_and_runs_two_attempts_then_exits_at_eof() -> None:
    proc, reader = _agent()
    assert proc.stdin is not None
    # A request of a kind this agent does not know (a newer launcher's) is ignored.
    proc.stdin.write(encode(99, agent=7) + encode_message(PROBE, ProbeRequest(ports=2, cwd="/"), agent=7))
    proc.stdin.flush()
    frames = read_frames_until(proc, reader, FACTS)
    assert decode_message(Hello, frames[0].payload) == Hello(VERSION, proc.pid) and frames[0].kind == HELLO
    assert frames[-1].agent == 7  # the agent answers with the id the launcher gave it
    facts = decode_message(Facts, frames[-1].payload)
    assert facts.cwd_exists and len(set(facts.free_ports)) == 2
    for attempt, code in enumerate((3, 0)):
        script = f"print('attempt {attempt}'); raise SystemExit({code})"
        spec = StartRequest("/", 1.0, [RankSpec(0, [sys.executable, "-c", script], {})])
        proc.stdin.write(encode_message(START, spec))
        proc.stdin.flush()
        frames = read_frames_until(proc, reader, DONE)
        assert (OUT, 0, 0, f"attempt {attempt}\n".encode()) in frames
        exits = [decode_message(RankExited, f.payload) for f in frames if f.kind == EXIT]
        assert [e.returncode for e in exits] == [code]
        # Measured with wait4 by the agent: the rank's pid, wall time, CPU time and peak RSS.
        assert exits[0].pid > 0 and exits[0].wall_s > 0 and exits[0].cpu_s > 0
        assert 1000 < exits[0].max_rss_kb < 10_000_000
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_start_request_env_replaces_leftovers_and_is_shared_by_ranks() -> None:
    proc, reader = _agent(TORCHELASTIC_USE_AGENT_STORE="True", KEEP="host")
    assert proc.stdin is not None
    names = ("TORCHELASTIC_USE_AGENT_STORE", "KEEP", "SHARED", "OWN")
    dump = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    ranks = [RankSpec(r, [sys.executable, "-c", dump], {"OWN": str(r)}) for r in range(2)]
    spec = StartRequest("/", 1.0, ranks, env={"SHARED": "yes"}, unset_prefixes=["TORCHELASTIC_"])
    proc.stdin.write(encode_message(START, spec))
    proc.stdin.flush()
    frames = read_frames_until(proc, reader, DONE)
    seen = {f.rank: json.loads(f.payload) for f in frames if f.kind == OUT}
    assert seen == {
        r: {"TORCHELASTIC_USE_AGENT_STORE": None, "KEEP": "host", "SHARED": "yes", "OWN": str(r)}
        for r in range(2)
    }
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_check_probe_reports_versions_disk_clock_and_tcp(tmp_path: Path) -> None:
    proc, reader = _agent()
    assert proc.stdin is not None
    before = time.time()
    request = ProbeRequest(
        ports=0, cwd=str(tmp_path), python=sys.executable, check=True, listen=True, script="x.py"
    )
    proc.stdin.write(encode_message(PROBE, request))
    proc.stdin.flush()
    facts = decode_message(Facts, read_frames_until(proc, reader, FACTS)[-1].payload)
    assert facts.python_version == ".".join(map(str, sys.version_info[:3]))
    assert facts.disk_free and facts.disk_free > 0
    assert before <= facts.time <= time.time()
    assert facts.torch is not None and facts.torch.get("version", "").startswith("2.")
    assert facts.listen_port > 0
    assert not facts.script_found
    # A second question connects to the port the first one opened: it stays open between probes.
    request = ProbeRequest(
        ports=0, cwd="/", connect_to="127.0.0.1", connect_port=facts.listen_port, check=True
    )
    proc.stdin.write(encode_message(PROBE, request))
    proc.stdin.flush()
    facts = decode_message(Facts, read_frames_until(proc, reader, FACTS)[-1].payload)
    assert facts.tcp_error == ""
    closed = ProbeRequest(ports=0, cwd="/", connect_to="127.0.0.1", connect_port=1, check=True)
    proc.stdin.write(encode_message(PROBE, closed))
    proc.stdin.flush()
    facts = decode_message(Facts, read_frames_until(proc, reader, FACTS)[-1].payload)
    assert facts.tcp_error == "Connection refused"
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_agent_that_stops_hearing_the_launcher_stops_its_ranks_and_says_why(tmp_path: Path) -> None:
    """The agent's own heartbeat-silence limit: with its channel open but nothing arriving, it stops its
    rank and exits, and its last stderr line (what distrun shows for a host whose connection closed) says
    that the agent gave up, after how long, and its limit."""
    proc, reader = _agent()
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(encode_message(PROBE, ProbeRequest(ports=1, cwd="/", heartbeat=0.2, dead_after=1.5)))
    proc.stdin.flush()
    read_frames_until(proc, reader, FACTS)
    pid_file = tmp_path / "rank.pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    proc.stdin.write(
        encode_message(START, StartRequest("/", 1.0, [RankSpec(0, [sys.executable, "-c", script], {})]))
    )
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0  # stdin still open: only the agent's patience ends it
    said = proc.stderr.read().decode().strip().splitlines()[-1]
    assert said.startswith("distrun agent: gave up on distrun after "), said
    assert said.endswith("without a word from it (it waits 1.5s): stopped the ranks"), said
    rank = int(pid_file.read_text())
    assert not psutil.pid_exists(rank) or psutil.Process(rank).status() == psutil.STATUS_ZOMBIE
    proc.stdin.close()
