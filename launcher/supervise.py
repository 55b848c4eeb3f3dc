"""Watch every host's agent until the job ends; the first failure, a signal or the timeout stops all of them.

One selector loop serves every host, local or remote: log relay, exit statuses, signals, lost hosts. A small
thread sends heartbeats to remote agents, so a console that blocks the loop cannot make them think we died.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from launcher import agent as proto
from launcher.errors import (
    EXIT_HOST,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_TIMEOUT,
    HostError,
    Interrupted,
)
from launcher.logs import LogRelay
from launcher.result import RankExit, RunResult, StopReason
from launcher.transport.link import Link

log = logging.getLogger(__name__)

# After STOP, how long past the grace period we wait for agents before dropping them.
TEARDOWN_SLACK = 5.0


class AgentConn:
    """A link plus the frame decoder for what comes back on it."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.reader = proto.FrameReader(after_hello=True)
        self.finished = False
        self.last_heard = time.monotonic()
        # Frames must not interleave: the heartbeat thread and the main loop both send.
        self._send_lock = threading.Lock()

    @property
    def host(self) -> str:
        return self.link.host

    def send(self, frame: bytes) -> None:
        with self._send_lock:
            if not self.finished:
                self.link.send(frame)

    def read(self) -> list[tuple[int, int, bytes]] | None:
        """Frames now available; None when the link closed."""
        data = self.link.recv()
        if data is None:
            return []
        if not data:
            return None
        self.last_heard = time.monotonic()
        return self.reader.feed(data)

    def diagnostics(self) -> str:
        """What the agent (or the host's login shell before it) said besides frames, for error messages."""
        said = (self.reader.preamble.decode(errors="replace") + "\n" + self.link.diagnostics()).strip()
        return said.splitlines()[-1] if said else ""


@contextmanager
def signal_pipe(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[int]:
    """While active, the returned fd becomes readable with one byte per signal received.

    Signals become bytes on a pipe the selector watches, so handlers never run job logic.
    """
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, lambda *_: None) for signum in signums}
    try:
        yield read_fd
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(old_wakeup)
        os.close(read_fd)
        os.close(write_fd)


def probe(
    conns: Sequence[AgentConn], payloads: Sequence[dict[str, Any]], timeout: float, wake_fd: int
) -> list[dict[str, Any]]:
    """Send each agent its preflight question and collect every host's facts (one round-trip, in parallel).

    A SIGINT/SIGTERM meanwhile raises Interrupted: nothing has started yet, so there is nothing to stop.
    """
    for conn, payload in zip(conns, payloads, strict=True):
        conn.send(proto.encode_json(proto.PROBE, payload))
    answers: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(wake_fd, selectors.EVENT_READ, None)
        for i, conn in enumerate(conns):
            sel.register(conn.link, selectors.EVENT_READ, i)
        while len(answers) < len(conns):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [conns[i].host for i in range(len(conns)) if i not in answers]
                raise HostError(f"host {missing[0]}: no answer from the distrun agent within {timeout:.0f}s")
            for key, _ in sel.select(remaining):
                i = key.data
                if i is None:
                    raise Interrupted.from_signals(os.read(wake_fd, 64))
                conn = conns[i]
                frames = conn.read()
                if frames is None:
                    detail = conn.diagnostics()
                    detail = f": {detail}" if detail else ""
                    raise HostError(f"host {conn.host}: the distrun agent exited before answering{detail}")
                for fkind, _, payload in frames:
                    if fkind == proto.FACTS:
                        answers[i] = json.loads(payload)
                        sel.unregister(conn.link)
    return [answers[i] for i in range(len(conns))]


class Supervisor:
    """Runs the started job to its end and says how it ended."""

    def __init__(
        self,
        conns: Sequence[AgentConn],
        rank_hosts: dict[int, str],
        relay: LogRelay,
        *,
        timeout: float | None,
        grace: float,
        heartbeat: float,
        dead_after: float,
        wake_fd: int,
    ) -> None:
        self.conns = list(conns)
        self.rank_hosts = rank_hosts
        self.relay = relay
        self.timeout = timeout
        self.grace = grace
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        self.wake_fd = wake_fd
        self.exits: dict[int, RankExit] = {}
        self.reason: StopReason | None = None
        self.first_failure: RankExit | None = None
        self.signal_name: str | None = None
        self.still_running: tuple[int, ...] = ()
        self.lost_host: str | None = None
        self.lost_detail = ""
        self.stop_at: float | None = None
        self.killed = False

    # -- stopping

    def _stop(self, reason: StopReason) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        self.stop_at = time.monotonic()
        self.still_running = tuple(sorted(r for r in self.rank_hosts if r not in self.exits))
        log.info("stopping every rank: %s", reason)
        for conn in self.conns:
            conn.send(proto.encode(proto.STOP))

    def _kill_now(self) -> None:
        self.killed = True
        for conn in self.conns:
            conn.send(proto.encode(proto.KILL))

    def _on_signal(self, signum: int) -> None:
        if self.reason is None:
            self.signal_name = signal.Signals(signum).name
            self._stop("signal")
        elif signum == signal.SIGINT and not self.killed:
            # A second Ctrl-C means "now": no more grace period.
            self._kill_now()

    def _lose(self, conn: AgentConn, detail: str) -> None:
        conn.finished = True
        conn.link.abort()
        if self.reason is None:
            self.lost_host = conn.host
            self.lost_detail = detail
            self._stop("host-lost")

    # -- frames

    def _on_frame(self, conn: AgentConn, kind: int, rank: int, payload: bytes) -> None:
        if kind == proto.OUT:
            self.relay.feed(rank, "stdout", payload)
        elif kind == proto.ERR:
            self.relay.feed(rank, "stderr", payload)
        elif kind == proto.EXIT:
            code = int(json.loads(payload)["returncode"])
            ended = RankExit(rank, self.rank_hosts.get(rank, conn.host), code)
            self.exits[rank] = ended
            if code != 0 and self.reason is None:
                self.first_failure = ended
                self._stop("failure")
        elif kind == proto.DONE:
            conn.finished = True

    # -- the loop

    def run(self) -> RunResult:
        started = time.monotonic()
        deadline = started + self.timeout if self.timeout else None
        next_check = started + self.heartbeat
        done = threading.Event()
        threading.Thread(target=self._send_beats, args=(done,), name="heartbeat", daemon=True).start()
        try:
            return self._loop(deadline, next_check)
        finally:
            done.set()

    def _loop(self, deadline: float | None, next_check: float) -> RunResult:
        with selectors.DefaultSelector() as sel:
            sel.register(self.wake_fd, selectors.EVENT_READ, None)
            for conn in self.conns:
                sel.register(conn.link, selectors.EVENT_READ, conn)
            while not all(c.finished for c in self.conns):
                now = time.monotonic()
                wait = next_check - now
                if deadline is not None and self.reason is None:
                    wait = min(wait, deadline - now)
                events = sel.select(max(0.0, wait))
                selected = time.monotonic()
                for key, _ in events:
                    conn = key.data
                    if conn is None:
                        self._drain_signals()
                        continue
                    frames = conn.read()
                    if frames is None:
                        sel.unregister(conn.link)
                        if not conn.finished:
                            self._lose(conn, conn.diagnostics() or "connection closed")
                        continue
                    for kind, rank, payload in frames:
                        self._on_frame(conn, kind, rank, payload)
                    if conn.finished:
                        sel.unregister(conn.link)
                self.relay.flush()
                now = time.monotonic()
                if now - selected > self.heartbeat:
                    # Our own loop was stuck (a console that does not read): nobody could be heard meanwhile.
                    for conn in self.conns:
                        conn.last_heard = max(conn.last_heard, now)
                if deadline is not None and now >= deadline and self.reason is None:
                    self._stop("timeout")
                if now >= next_check:
                    next_check = now + self.heartbeat
                    self._check_hosts(now)
        self.relay.finish()
        return self._result()

    def _send_beats(self, done: threading.Event) -> None:
        """Tell remote agents we are alive, even while the main loop is blocked writing to the console."""
        while not done.wait(self.heartbeat):
            for conn in self.conns:
                if conn.link.remote:
                    conn.send(proto.encode(proto.BEAT))

    def _drain_signals(self) -> None:
        try:
            data = os.read(self.wake_fd, 64)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGINT, signal.SIGTERM):
                self._on_signal(signum)

    def _check_hosts(self, now: float) -> None:
        for conn in self.conns:
            # Local agents need no heartbeat: a dead one closes its pipe, which the loop sees at once.
            if not conn.finished and conn.link.remote and now - conn.last_heard > self.dead_after:
                self._lose(conn, f"no word from it for {now - conn.last_heard:.0f}s")
        if self.stop_at is not None and now - self.stop_at > self.grace + TEARDOWN_SLACK:
            for conn in self.conns:
                if not conn.finished:
                    log.warning("host %s: agent did not finish stopping its ranks; dropping it", conn.host)
                    conn.finished = True
                    conn.link.abort()

    def _result(self) -> RunResult:
        code = EXIT_OK
        if self.reason == "failure" and self.first_failure is not None:
            code = self.first_failure.exit_code
        elif self.reason == "signal":
            code = EXIT_SIGINT if self.signal_name == "SIGINT" else EXIT_SIGTERM
        elif self.reason == "timeout":
            code = EXIT_TIMEOUT
        elif self.reason == "host-lost":
            code = EXIT_HOST
        return RunResult(
            exit_code=code,
            reason=self.reason,
            first_failure=self.first_failure,
            signal_name=self.signal_name,
            still_running=self.still_running,
            lost_host=self.lost_host,
            lost_detail=self.lost_detail,
            timeout=self.timeout,
        )
