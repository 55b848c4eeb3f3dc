"""The per-host agent: owns one host's ranks for the launcher.

It is stdlib-only and self-contained (with `launcher.agent.protocol`, shipped alongside it: see
`launcher.backends.bootstrap`), so worker hosts need a Python interpreter and nothing else. The launcher
talks to it with the frames of `launcher.agent.protocol` on stdin/stdout; everything the agent must know (the
ranks' env included) comes over that channel, never on a command line, so secrets stay out of `ps` and nothing
passes through a shell.

One agent serves every attempt of a job: PROBE -> FACTS, START -> OUT/ERR/EXIT frames while ranks run, DONE
when all are gone; then it waits for the next PROBE. STOP (or stdin EOF, or SIGTERM/SIGHUP to the agent, or
the launcher's heartbeats stopping) sends SIGTERM (SIGINT first, when STOP says so) to every rank's process
group and SIGKILL after the grace period, so a launcher that dies, even by SIGKILL, leaves no rank behind.
SIGNAL forwards a signal (SIGUSR1, SIGSTOP/SIGCONT for Ctrl-Z and fg) to every running rank. The agent exits
at stdin EOF once its ranks are gone. What a PROBE is answered with is `launcher.agent.facts`.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Collection  # noqa: UP035 - Python 3.7 runs this

from launcher.agent.environment import rank_environment, start_environment
from launcher.agent.facts import host_facts
from launcher.agent.protocol import (
    ADD,
    BEAT,
    BLOB,
    DONE,
    ERR,
    EXIT,
    FACTS,
    FETCH,
    KILL,
    LEAVE,
    NOTICE,
    ORPHAN_GRACE_CAP,
    PROBE,
    READ_SIZE,
    RESET,
    SAMPLES,
    SIGNAL,
    STACK_DUMP,
    STACKS,
    START,
    STOP,
    SYNC,
    VERSION,
    Frame,
    FrameReader,
    Handlers,
    Hello,
    ProbeRequest,
    RankExited,
    SignalRequest,
    StartRequest,
    StopRequest,
    dispatch,
    encode,
    encode_hello,
    encode_message,
    write_all,
)
from launcher.agent.rank_process import (
    RankProcess,
    die_with_agent_hook,
    pre_exec,
    signal_number,
    start_failure,
)
from launcher.agent.reaper import become_subreaper, descendants, reap_adopted, signal_descendants
from launcher.agent.receive import Receiver, listen
from launcher.agent.sampling import Sampler
from launcher.agent.stackdump import POLL_SECONDS, DumpDir, Gathering, stack_reply
from launcher.agent.transport import launcher_answering

if TYPE_CHECKING:  # an elastic job's and the stack frames' modules load when a job uses them (start-up time)
    from launcher.agent.elastic import ElasticLines
    from launcher.agent.protocol import LeaveRequest, Notice, ResetRequest, StacksRequest

# A launcher that waits for its user (see `ProbeRequest.wait_while_stopped`) is given up on only once its
# machine has not answered on two looks this far apart: one look may fall within a probe's round trip.
UNANSWERED_CONFIRM = 1.0


class Agent:
    """One host's agent, reading frames from `in_fd` and writing to `out_fd`.

    `clock` (monotonic seconds) and `start_process` (subprocess.Popen's signature) are parameters so that a
    test can run an agent in its own process with a fake clock and fake ranks.
    """

    def __init__(
        self,
        in_fd: int,
        out_fd: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        start_process: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
        err_fd: int = 2,
    ) -> None:
        self.clock = clock
        self.err_fd = err_fd  # where the agent says why it gave up (an SSH channel's stderr)
        self.start_process = start_process
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.sel = selectors.DefaultSelector()
        self.reader = FrameReader()
        self.launcher_gone = False
        self.beat_every = 0.0  # 0: no heartbeats (until a PROBE asks for them)
        self.dead_after = 0.0
        self.last_heard = self.clock()
        self.next_beat = 0.0
        self.listener: socket.socket | None = None  # `distrun check`: open until the agent exits
        self.paused = False  # the launcher is suspended (Ctrl-Z): its silence means nothing
        # The launcher is a terminal's job: stopped without a word (SIGSTOP), it is still waited for.
        self.wait_while_stopped = False
        self.unanswered_since: float | None = None  # when its machine was first seen not answering
        self.dump_dir: DumpDir | None = None  # made at the first START: the ranks' stack hook and dumps
        self.gatherings: list[Gathering] = []
        self._die_with_agent: Any = None
        self.agent_id = 0
        # What the launcher may ask, by frame kind; other kinds are ignored (a newer launcher's requests).
        self.handlers: Handlers = {
            PROBE: lambda _, request: self.probe(request),
            START: lambda _, request: self.start(request),
            STOP: self._on_stop,
            SIGNAL: lambda _, request: self.forward(request),
            KILL: lambda *_: self.kill(),
            STACKS: lambda _, request: self.gather(request),
            SYNC: lambda _, request: self._send_all(self.receiver.start(request)),
            BLOB: lambda _, payload: self._send_all(self.receiver.blob(payload)),
            FETCH: lambda _, request: self._send_all(self.receiver.fetch(request)),
            NOTICE: lambda _, notice: self.notice(notice),
            RESET: lambda _, request: self.reset(request),
            LEAVE: lambda _, request: self.leave(request),
            ADD: lambda _, request: self.add(request),
        }
        self.receiver = Receiver()  # --workdir
        # A subreaper (see launcher.agent.reaper), which `run` makes this process: its descendants are then
        # the job's, to stop and reap. An agent driven in-process by a test is none, and leaves others' alone.
        self.reaping = False
        self._new_attempt()

    def _new_attempt(self) -> None:
        lines: ElasticLines | None = getattr(self, "elastic", None)
        if lines is not None:
            self.sel.unregister(lines)
            lines.close()
        self.elastic: ElasticLines | None = None  # the ranks' elastic sockets (StartRequest.elastic)
        self.ranks: dict[int, RankProcess] = {}
        self.by_fd: dict[int, RankProcess] = {}
        self.grace = 5.0
        self.started = False
        self.kill_at: float | None = None  # when stopping: the SIGKILL deadline
        self.term_at: float | None = None  # when stopping with SIGINT first: the SIGTERM deadline
        self.leftovers_at: float | None = None
        self.sampler = Sampler(0.0, 0.0)  # START sets the pace (--sample-interval)

    # -- output to the launcher

    def send(self, kind: int, rank: int = -1, payload: bytes = b"") -> None:
        """A frame to the launcher, stamped with this agent's id."""
        self._write(encode(kind, rank, payload, self.agent_id))

    def send_message(self, kind: int, message: Any, rank: int = -1) -> None:
        self._write(encode_message(kind, message, rank, self.agent_id))

    def _send_all(self, messages: list[tuple[int, Any]]) -> None:
        for kind, message in messages:
            self.send_message(kind, message)

    def _write(self, frame: bytes) -> None:
        if self.launcher_gone:
            return
        try:
            write_all(self.out_fd, frame)
        except OSError:
            self._lost_launcher()

    def _launcher_silent(self, now: float, silent: float) -> None:
        """The launcher said nothing for longer than our patience. One that was stopped (told by Ctrl-Z, or a
        terminal's job) is waited for as long as its machine acknowledges what we send it."""
        if not (self.paused or self.wait_while_stopped):
            self._give_up(silent)
            return
        if launcher_answering(self.in_fd, self.dead_after) is not False:
            self.unanswered_since = None
        elif self.unanswered_since is None:
            self.unanswered_since = now
        elif now - self.unanswered_since >= UNANSWERED_CONFIRM:
            self._give_up(silent, unanswered=True)

    def _give_up(self, silent: float, unanswered: bool = False) -> None:
        """The launcher's silence outlasted our patience. Said on stderr, which reaches the launcher as the
        reason its channel closed should the network come back: the agent, not distrun, ended the job here."""
        if self.launcher_gone:
            return
        why = (
            f", nor an acknowledgement from its machine for {self.dead_after:g}s (it waits for a stopped "
            "distrun while its machine answers)"
            if unanswered
            else f" (it waits {self.dead_after:g}s)"
        )
        said = f"distrun agent: gave up on distrun after {silent:.0f}s without a word from it{why}: "
        said += "stopped the ranks\n"
        with contextlib.suppress(OSError):
            os.write(self.err_fd, said.encode())
        self._lost_launcher()

    def _lost_launcher(self) -> None:
        if not self.launcher_gone:
            self.launcher_gone = True
            self.stop(min(self.grace, ORPHAN_GRACE_CAP))

    # -- rank processes

    def probe(self, request: ProbeRequest) -> None:
        self.beat_every = request.heartbeat
        self.dead_after = request.dead_after
        self.wait_while_stopped = request.wait_while_stopped
        if request.listen and self.listener is None:
            self.listener = listen()
        self.send_message(FACTS, host_facts(request, self.listener))
        # While the launcher turns the facts into the ranks' environments: what START needs (ctypes).
        self.die_with_agent()

    def die_with_agent(self) -> Any:
        if self._die_with_agent is None:
            self._die_with_agent = die_with_agent_hook() or False
        return self._die_with_agent or None

    def start(self, spec: StartRequest) -> None:
        self.receiver.stop_serving()  # no thread may run while ranks are forked
        self._new_attempt()
        self.started = True
        self.grace = spec.grace
        if self.dump_dir is None:
            self.dump_dir = DumpDir()
        self.sampler = Sampler(spec.sample_interval, self.clock(), progress_dir=self.dump_dir.path)
        if spec.elastic and self.elastic is None:
            from launcher.agent.elastic import ElasticLines

            self.elastic = ElasticLines(self.dump_dir.path)
            self.sel.register(self.elastic, selectors.EVENT_READ, "elastic")
        self._spawn(spec)
        if self.launcher_gone:  # the launcher vanished while we were starting
            self.stop(ORPHAN_GRACE_CAP)

    def _spawn(self, spec: StartRequest) -> None:
        """Start the request's ranks beside any running ones (START, or ADD during an elastic reset)."""
        assert self.dump_dir is not None
        # Leftovers of another launcher go first; the launcher's environment comes over them.
        shared = start_environment(os.environ, spec)
        cwd = spec.workdir or spec.cwd or None
        if spec.workdir:  # ranks import the copy's modules first, as `python DIR/x.py` would from DIR
            shared["PYTHONPATH"] = os.pathsep.join(p for p in (spec.workdir, shared.get("PYTHONPATH")) if p)
        die_with_agent = self.die_with_agent()
        for r in spec.ranks:
            env = rank_environment(shared, r)
            env.update(self.dump_dir.rank_env(env))
            if self.elastic is not None:
                from launcher.agent.elastic import SOCKET_VAR

                env[SOCKET_VAR] = self.elastic.open(r.rank)
            try:
                proc = self.start_process(
                    r.argv,
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    # A pre-exec hook is safe here: the agent has a single thread.
                    preexec_fn=pre_exec(die_with_agent, r.cpus),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                code, line = start_failure(exc, r.argv, r.cpus, r.rank, env)
                self.send(ERR, r.rank, line.encode())
                self.send_message(EXIT, RankExited(code), r.rank)
                continue
            entry = RankProcess(r.rank, proc, self.clock())
            self.ranks[r.rank] = entry
            for fd in entry.fds:
                self.by_fd[fd] = entry
                self.sel.register(fd, selectors.EVENT_READ, "pipe")

    # -- elastic resets in place (launcher.agent.elastic)

    def add(self, spec: StartRequest) -> None:
        """New ranks joining the running ones at a reset; on a spare host (no rank yet), the first ones."""
        if not self.started and spec.elastic:
            self.start(spec)
        elif self.started and self.elastic is not None:
            self._spawn(spec)

    def notice(self, notice: Notice) -> None:
        if self.elastic is not None:
            self.elastic.on_notice(notice)

    def reset(self, request: ResetRequest) -> None:
        if self.elastic is not None:
            self.elastic.on_reset({int(rank_id): env for rank_id, env in request.envs.items()})

    def leave(self, request: LeaveRequest) -> None:
        if self.elastic is not None:  # who never opted in has no line to hear `leave` on, nor state to keep
            self._signal_all(signal.SIGKILL, only=self.elastic.leave(request.ranks))

    def _read_elastic(self) -> None:
        assert self.elastic is not None
        for kind, message, rank_id in self.elastic.frames():
            if message is None:
                self.send(kind, rank_id)
            else:
                self.send_message(kind, message, rank_id)

    def _signal_all(self, sig: int, leftovers: bool = False, only: Collection[int] | None = None) -> None:
        signalled: set[int] = set()
        for entry in self.ranks.values():
            if (entry.returncode is None or leftovers) and (only is None or entry.rank in only):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(entry.pgid, sig)
                    signalled.add(entry.pgid)
        if self.reaping and (leftovers or sig in (signal.SIGSTOP, signal.SIGCONT)):
            # What left the ranks' groups (own sessions, daemons): every descendant, adopted ones included.
            signal_descendants(sig, skip_groups=signalled)

    def stop(self, grace: float | None = None, first: int = signal.SIGTERM) -> None:
        if not self.started:
            return  # between attempts there is nothing to stop (a late STOP of the last attempt, say)
        self._mark_stopped()
        now = self.clock()
        grace = self.grace if grace is None else grace
        if self.kill_at is None or now + grace < self.kill_at:
            self.kill_at = now + grace
        if first != signal.SIGTERM and self.term_at is None:
            self.term_at = now + grace / 2
        self._signal_all(first, leftovers=True)

    def _mark_stopped(self) -> None:
        """Before a stop's first signal: the ranks it reaches. Those that already exited are reaped first, so
        a rank that ended on its own just before is reported as such, not as stopped."""
        self._reap()
        for entry in self.ranks.values():
            if entry.returncode is None:
                entry.stopped = True

    def _on_stop(self, frame: Frame, request: StopRequest) -> None:
        self.stop(first=signal_number(request.first) or signal.SIGTERM)

    def forward(self, request: SignalRequest) -> None:
        signum = signal_number(request.name)
        if signum is None:
            return
        if signum == signal.SIGSTOP:
            self.paused = True
        elif signum == signal.SIGCONT:
            self.paused = False
            self.last_heard = self.clock()
        if self.started:
            self._signal_all(signum)

    def gather(self, request: StacksRequest) -> None:
        """Start reading the running ranks' stacks; STACK_DUMP answers once all are read or `wait` passed."""
        running = {e.rank: e.proc.pid for e in self.ranks.values() if e.returncode is None}
        if self.dump_dir is None or not running:
            self.send_message(STACK_DUMP, stack_reply(request.request_id))
            return
        now = self.clock()
        gathering = Gathering(
            request.request_id, running, self.dump_dir, tool=request.tool, wait=request.wait, now=now
        )
        self.gatherings.append(gathering)
        self._poll_gatherings(now)

    def _poll_gatherings(self, now: float) -> None:
        for gathering in [g for g in self.gatherings if g.poll(now)]:
            self.gatherings.remove(gathering)
            self.send_message(STACK_DUMP, stack_reply(gathering.request_id, gathering.results()))

    def _sample(self, now: float) -> None:
        running = {e.rank: e.proc.pid for e in self.ranks.values() if e.returncode is None}
        samples = self.sampler.take(running, now)
        if samples is not None and (samples.ranks or samples.error):
            self.send_message(SAMPLES, samples)

    def kill(self) -> None:
        if not self.started:
            return
        self._mark_stopped()
        self.kill_at = self.clock()
        self._signal_all(signal.SIGKILL, leftovers=True)

    def _read_pipe(self, fd: int) -> bool:
        """Relay one chunk of a rank's output; False when nothing more is there now (or ever)."""
        entry = self.by_fd[fd]
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            self.send(entry.fds[fd], entry.rank, data)
            self.sampler.wrote(entry.rank, self.clock())
            return True
        self._close_pipe(fd)
        return False

    def _close_pipe(self, fd: int) -> None:
        self.sel.unregister(fd)
        self.by_fd.pop(fd).files[fd].close()

    def _drain(self, entry: RankProcess) -> None:
        """Relay what the rank wrote before it exited, so EXIT follows its last output."""
        for fd in entry.fds:
            if fd in self.by_fd:
                os.set_blocking(fd, False)
                while fd in self.by_fd and self._read_pipe(fd):
                    pass

    def _reap(self) -> None:
        for entry in self.ranks.values():
            if entry.returncode is not None:
                continue
            exited = entry.reaped(self.clock())
            if exited is None:
                continue
            if self.elastic is not None and exited.returncode != 0:
                # What the rank forked after joining its group (DataLoader workers) holds its sockets open,
                # so its peers would not see it gone: its process group goes with it, and the survivors'
                # reset begins now, not when those children notice their parent died.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(entry.pgid, signal.SIGKILL)
            self._drain(entry)
            self.send_message(EXIT, exited, entry.rank)
        if self.reaping:
            reap_adopted({e.proc.pid for e in self.ranks.values() if e.returncode is None})

    # -- control from the launcher

    def _read_control(self) -> bool:
        """Returns False when the launcher closed the channel."""
        try:
            data = os.read(self.in_fd, READ_SIZE)
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(self.in_fd)
            self._lost_launcher()
            return False
        self.last_heard = self.clock()
        for frame in self.reader.feed(data):
            # The launcher names us in its frames: ours carry the same id back (see launcher.agent.protocol).
            self.agent_id = frame.agent
            dispatch(self.handlers, frame)
        return True

    def _all_exited(self) -> bool:
        return all(e.returncode is not None for e in self.ranks.values())

    def _leftovers(self) -> bool:
        """Something the ranks started still runs (detached from their groups, say)."""
        return self.reaping and bool(descendants())

    def _finish_attempt(self, now: float) -> bool:
        """Once every rank and its process group is gone: DONE. True when the attempt is over."""
        if not self._all_exited():
            return False
        if self.by_fd or self._leftovers():
            # Leaders are gone but something they started (a DataLoader worker, a detached daemon) runs on.
            if self.leftovers_at is None:
                self._signal_all(signal.SIGTERM, leftovers=True)
                self.leftovers_at = now + min(self.grace, ORPHAN_GRACE_CAP)
                return False
            if now < self.leftovers_at and (self.by_fd or self._leftovers()):
                return False
            for fd in list(self.by_fd):
                self._close_pipe(fd)
        self._signal_all(signal.SIGKILL, leftovers=True)
        self.send(DONE)
        self._new_attempt()
        return True

    def run(self) -> int:
        self.reaping = (
            become_subreaper()
        )  # see launcher.agent.reaper: detached descendants of the ranks stay ours
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(self.in_fd, selectors.EVENT_READ, "control")
        self.sel.register(self.receiver.fileno(), selectors.EVENT_READ, "fetched")
        control_open = True
        exiting = False
        while True:
            timeout = 0.5
            now = self.clock()
            if self.beat_every:
                if now >= self.next_beat:
                    self.send(BEAT)
                    self.next_beat = now + self.beat_every
                silent = now - self.last_heard
                # Beats may be waiting unread after a long blocking send: silence is only what nobody sent.
                if (
                    self.dead_after
                    and silent > self.dead_after
                    and control_open
                    and not select.select([self.in_fd], [], [], 0)[0]
                ):
                    self._launcher_silent(now, silent)
                else:
                    self.unanswered_since = None
            deadlines = (
                self.kill_at,
                self.term_at,
                self.leftovers_at,
                self.next_beat or None,
                self.sampler.next_at,
            )
            for deadline in deadlines:
                if deadline is not None:
                    timeout = max(0.0, min(timeout, deadline - now))
            if self.gatherings:
                timeout = min(timeout, POLL_SECONDS)
            events = self.sel.select(timeout)
            # Reaping looks at every rank, so only when a child may have exited: SIGCHLD, a pipe's EOF, or a
            # quiet spell (a fallback should a SIGCHLD ever be missed). Busy output must not make it O(ranks).
            reap = not events
            for key, _ in events:
                if key.data == "control":
                    control_open = self._read_control()
                elif key.data == "elastic":
                    self._read_elastic()
                elif key.data == "fetched":
                    self._send_all(self.receiver.fetched())
                elif key.data == "wake":
                    try:
                        signums = os.read(wake_r, 512)
                    except BlockingIOError:
                        signums = b""
                    reap = reap or signal.SIGCHLD in signums
                    if any(s in signums for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)):
                        # Whoever signals the agent itself wants the host cleared, then the agent gone.
                        self.stop()
                        exiting = True
                elif key.fd in self.by_fd and not self._read_pipe(key.fd):
                    reap = reap or key.fd not in self.by_fd
            if reap:
                self._reap()
            now = self.clock()
            if self.gatherings:
                self._poll_gatherings(now)
            if self.started and self.sampler.due(now):
                self._sample(now)
            if self.term_at is not None and now >= self.term_at:
                self.term_at = None
                self._signal_all(signal.SIGTERM, leftovers=True)
            if self.kill_at is not None and now >= self.kill_at and not self._all_exited():
                self._signal_all(signal.SIGKILL)
            if self.started:
                self._finish_attempt(now)
            if not self.started and (exiting or self.launcher_gone or not control_open):
                return 0


def serve(in_fd: int, out_fd: int) -> int:
    """Be the agent on this channel (a pipe pair, an SSH channel's stdio, a socket) until it closes."""
    write_all(out_fd, encode_hello(Hello(VERSION, os.getpid())))
    agent = Agent(in_fd, out_fd)
    try:
        return agent.run()
    finally:
        if agent.dump_dir is not None:
            agent.dump_dir.remove()


def main() -> int:
    # The protocol owns fd 1; anything the agent process prints by accident must not corrupt it.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    return serve(0, out_fd)


if __name__ == "__main__":
    sys.exit(main())
