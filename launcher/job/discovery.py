"""Run the user's `--host-discovery-script` and read the hosts it prints (`host[:slots]` per line).

Between attempts it runs as a phase of the job's loop (`Discovering`), so that signals, --timeout, lost
hosts and `distrun stacks` are handled meanwhile as in every other phase; `discover` runs it on its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from launcher.core.hosts import Host, parse_host_entry
from launcher.core.result import Outcome
from launcher.errors import DistrunError, UsageError
from launcher.job.pause import BetweenAttempts
from launcher.runtime.loop import Loop
from launcher.runtime.node import Node

log = logging.getLogger(__name__)

TIMEOUT = 30.0


class DiscoveryError(UsageError):
    """The discovery script failed or printed something that is not a host."""


def parse_discovery_output(text: str, script: Path, slots_per_host: int | None = None) -> tuple[Host, ...]:
    """Blank lines and `#` comments are skipped; a host listed twice is kept once, with its last line's slots
    (Horovod's rule), in the place of its first. A line without `:slots` gets `slots_per_host`
    (--slots-per-host), else 1."""
    hosts: dict[str, Host] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            host = parse_host_entry(line, f"{script}:{number}")
        except ValueError as err:
            raise DiscoveryError(f"{script} output line {number} {line!r}: {err}") from None
        if slots_per_host is not None and ":" not in line.rpartition("]")[2]:
            host = dataclasses.replace(host, slots=slots_per_host)
        hosts[host.name] = host
    return tuple(hosts.values())


def _start(script: Path, stderr: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """Its argv is the path alone: nothing passes through a shell. It runs in a process group of its own, so
    that when it overruns its time the whole group goes (a `sleep` it started, a pipeline), not only the
    script, and nothing of it keeps running or holds its pipes."""
    try:
        return subprocess.Popen(
            [str(script)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    except OSError as err:
        reason = err.strerror or err
        raise DiscoveryError(f"--host-discovery-script {script}: cannot run it: {reason}") from None


class DiscoveryOverran(DiscoveryError):
    """The discovery script gave no answer in its time."""


def _overran(script: Path, timeout: float) -> DiscoveryError:
    return DiscoveryOverran(
        f"--host-discovery-script {script}: no answer within {timeout:.3g}s; stopped it and what it started"
    )


def _result(
    script: Path, returncode: int, out: bytes, err_out: bytes, slots_per_host: int | None = None
) -> tuple[Host, ...]:
    if returncode != 0:
        said = err_out.decode(errors="replace").strip().splitlines()
        detail = f": {said[-1]}" if said else ""
        raise DiscoveryError(f"--host-discovery-script {script} exited with code {returncode}{detail}")
    return parse_discovery_output(out.decode(errors="replace"), script, slots_per_host)


def discover(script: Path, timeout: float = TIMEOUT, slots_per_host: int | None = None) -> tuple[Host, ...]:
    """The hosts the script lists now; DiscoveryError when it fails or overruns `timeout`."""
    proc = _start(script)
    try:
        out, err_out = proc.communicate(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()  # reaps it; its pipes closed with the group
        raise _overran(script, timeout) from None
    except BaseException:  # Ctrl-C meanwhile: nothing of the script is left running
        _kill_group(proc)
        proc.communicate()
        raise
    _kill_group(proc)  # what it left running in its group (a background `sleep &`)
    return _result(script, proc.returncode, out, err_out, slots_per_host)


class Discovering(BetweenAttempts):
    """The script, run between attempts on the job's loop: its output read as it comes; `hosts` once it
    exited, `error` when it failed or overran `timeout`; or the job's `outcome` (a signal, --timeout), which
    stops it at once."""

    def __init__(
        self,
        script: Path,
        timeout: float,
        nodes: Sequence[Node],
        dead_after: float,
        slots_per_host: int | None = None,
    ) -> None:
        super().__init__(nodes, dead_after)
        self.script = script
        self.slots_per_host = slots_per_host
        self.limit = timeout
        self.end = time.monotonic() + timeout
        self.proc = _start(script)
        self._out, self._err = bytearray(), bytearray()
        self._open = 0  # its pipes not closed yet
        self.hosts: tuple[Host, ...] = ()
        self.error: DiscoveryError | None = None
        self._ended = False

    def watches(self) -> Sequence[tuple[Any, Callable[[float], bool]]]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._open = 2
        return [
            (self.proc.stdout, partial(self._read, self.proc.stdout.fileno(), self._out)),
            (self.proc.stderr, partial(self._read, self.proc.stderr.fileno(), self._err)),
        ]

    @property
    def done(self) -> bool:
        return self._ended or self.outcome is not None

    def doing(self, now: float) -> str:
        return f"running --host-discovery-script {self.script.name} before a restart"

    def next_due(self) -> float | None:
        return self.end

    def _read(self, fd: int, into: bytearray, now: float) -> bool:
        data = os.read(fd, 65536)
        if data:
            into += data
            return True
        self._open -= 1
        if not self._open:
            self._exited()
        return False

    def _exited(self) -> None:
        # Both pipes closed: it has exited, or will soon (what it left behind is killed with its group).
        try:
            returncode = self.proc.wait(timeout=max(0.0, self.end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.error = _overran(self.script, self.limit)
        else:
            try:
                self.hosts = _result(
                    self.script, returncode, bytes(self._out), bytes(self._err), self.slots_per_host
                )
            except DiscoveryError as err:
                self.error = err
        self._ended = True

    def on_tick(self, now: float) -> None:
        super().on_tick(now)
        if not self._ended and now >= self.end:
            self.error = _overran(self.script, self.limit)
            self._ended = True

    def close(self) -> None:
        """Whatever ended it: nothing it started keeps running."""
        _kill_group(self.proc)
        if self.proc.poll() is None:
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class Polling:
    """One run of the script while an attempt runs (launcher.job.host_watch): its stdout read by the job's
    loop as it comes (`on_readable`), its stderr kept in a file; `finished` once it exited (then `hosts`, or
    `error`), or `overran` it is stopped with its group."""

    def __init__(self, script: Path, timeout: float, slots_per_host: int | None = None) -> None:
        self.script = script
        self.limit = timeout
        self.end = time.monotonic() + timeout
        self.slots_per_host = slots_per_host
        import tempfile  # only an elastic job with a discovery script uses it

        self._err_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by `close`, after the run
        try:
            self.proc = _start(script, stderr=self._err_file)
        except DiscoveryError:
            self._err_file.close()
            raise
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout
        self._out = bytearray()
        self.finished = False
        self.hosts: tuple[Host, ...] = ()
        self.error: DiscoveryError | None = None

    def on_readable(self, now: float) -> bool:
        """Read what it printed; False once its stdout closed (it exited: the result is set)."""
        data = os.read(self.stdout.fileno(), 65536)
        if data:
            self._out += data
            return True
        if self.error is not None:  # it overran: `check` stopped its group, which closed the pipe
            self.finished = True
            return False
        try:
            returncode = self.proc.wait(timeout=max(0.0, self.end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.error = _overran(self.script, self.limit)
        else:
            self._err_file.seek(0)
            try:
                self.hosts = _result(
                    self.script, returncode, bytes(self._out), self._err_file.read(), self.slots_per_host
                )
            except DiscoveryError as err:
                self.error = err
        self.finished = True
        return False

    def check(self, now: float) -> None:
        """Past its time: its group is stopped, which closes its stdout (the loop then calls `on_readable`,
        which ends the run with the error)."""
        if not self.finished and self.error is None and now >= self.end:
            self.error = _overran(self.script, self.limit)
            _kill_group(self.proc)

    def close(self) -> None:
        """Nothing it started keeps running; its pipe and file closed (once the loop stopped watching)."""
        _kill_group(self.proc)
        if self.proc.poll() is None:
            self.proc.wait()
        self.stdout.close()
        self._err_file.close()


def between_attempts(
    script: Path | None, loop: Loop, nodes: list[Node], dead_after: float, slots_per_host: int | None
) -> tuple[Host, ...] | Outcome:
    """The hosts the discovery script lists now, run as a phase of the job's `loop`; a signal or --timeout
    meanwhile ends the job (its outcome). A failing script is logged: the job goes on with the hosts it
    has."""
    if script is None:
        return ()
    to_deadline = loop.deadline.left(time.monotonic())
    left = TIMEOUT if to_deadline is None else min(TIMEOUT, to_deadline)
    if left <= 0:
        return ()  # --timeout has expired: the job ends before any restart
    try:
        phase = Discovering(script, left, nodes, dead_after, slots_per_host)
        try:
            loop.run(phase)
        finally:
            phase.close()
        if phase.outcome is not None:
            return phase.outcome
        if phase.error is not None:
            raise phase.error
        return phase.hosts
    except DistrunError as err:
        # A flaky discovery script must not end a job that could go on with the hosts it has.
        log.warning("%s; going on with the hosts already known", err)
        return ()
