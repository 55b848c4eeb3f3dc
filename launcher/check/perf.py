"""`distrun check --perf` and a launch's `--preflight`, the side effects: one measurement process per host,
started by its agent like a rank (the ranks' interpreter, the launch's environment), all of them in one
torch.distributed group (gloo on CPUs, NCCL on GPUs) that runs every round; then, where the first pass found
suspects, a second, smaller group that re-tests each against a host known to be good.

A host whose process cannot run (no torch, a blocked port, a crash) is a named problem: the group is stopped
and measured again without it. Every pass is bounded by PASS_TIMEOUT and by --timeout.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launcher.agent.protocol import (
    DONE,
    ERR,
    EXIT,
    KILL,
    OUT,
    START,
    Frame,
    ProbeRequest,
    RankExited,
)
from launcher.backends import api as backend
from launcher.check.figures import (
    COMPUTE_KINDS,
    Gpu,
    HostFigures,
    LinkSample,
    Outlier,
    compute_suspects,
    judge,
    link_figures,
    references,
    still_slow,
    suspects,
)
from launcher.check.pairing import Round, matchings, retests
from launcher.check.verdict import Finding
from launcher.core.command import interpreter
from launcher.core.config import LaunchConfig
from launcher.core.hosts import Host
from launcher.core.plan import PlanInputs, build_plan, plural
from launcher.core.rendezvous import Rendezvous
from launcher.core.start_requests import start_requests
from launcher.errors import HostError, Interrupted
from launcher.runtime.loop import Deadline, Loop, Phase
from launcher.runtime.node import Node
from launcher.runtime.probe import probe
from launcher.signals import stopping

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("perf_worker.py")
STAGE, RESULT = "DISTRUN-PERF-STAGE ", "DISTRUN-PERF-RESULT "
STAGES = ("", "started", "imported", "joined")

# Sizes: a few MB per direction is ~10 ms on a healthy 10 Gb/s link and 1.7 s on a 20 Mbit/s one, so a slow
# link stands out by orders of magnitude while 32 hosts stay within seconds; GPUs move more, so that NCCL
# over fast fabrics is timed over milliseconds, not microseconds.
CPU_LINK_BYTES = 4 << 20
GPU_LINK_BYTES = 64 << 20
PINGS = 20
# A transfer is repeated while the repeats took less than this, at most REPEATS times (RETEST_REPEATS in a
# re-test), and the best one counts: a fast link's transfer takes a millisecond, which one descheduled moment
# of a busy host doubles (32 hosts sharing two cores named links at 3 transfers each, and none at 30); a slow
# link's takes a second or more and is timed once.
REPEAT_SECONDS = 0.25
REPEATS = 30
RETEST_REPEATS = 60
# CPU compute: the best 0.1 s window of 0.8 s, twice (before and after the transfers). A window spans a
# whole CFS period (100 ms), so a CPU quota shows in every one.
COMPUTE_SECONDS = 0.8
COMPUTE_WINDOW = 0.1
INTRA_BYTES = 64 << 20
CPU_ALLREDUCE_BYTES = 4 << 20
GPU_ALLREDUCE_BYTES = 64 << 20
# One pass (start-up, import of torch, every round) gives up after this long; a re-test pass likewise.
PASS_TIMEOUT = 120.0
# After KILL, how long the agents get to report their processes gone.
KILL_WAIT = 10.0
PROBE_STALL = 30.0


@dataclass(frozen=True)
class PerfResult:
    """What the check measured and whom it names: `problems`, hosts that could not be measured."""

    hosts: tuple[HostFigures, ...] = ()
    samples: tuple[LinkSample, ...] = ()
    outliers: tuple[Outlier, ...] = ()
    problems: tuple[Finding, ...] = ()
    allreduce_bps: float | None = None
    seconds: float = 0.0
    startup_s: float = 0.0
    rounds: int = 0
    retest_rounds: int = 0

    @property
    def named(self) -> list[str]:
        """Every host named, outliers and problems, once each in the order found."""
        names = [o.host for o in self.outliers] + [p.host for p in self.problems]
        return list(dict.fromkeys(names))

    def record(self) -> dict[str, Any]:
        """The report's `perf` object (docs/report.schema.json)."""
        from launcher.check.figures import figures_record

        return {
            **figures_record(self.hosts, self.samples, self.outliers),
            "allreduce_bps": self.allreduce_bps,
            "seconds": round(self.seconds, 3),
            "startup_s": round(self.startup_s, 3),
            "rounds": self.rounds,
            "retest_rounds": self.retest_rounds,
            "problems": [{"host": p.host, "what": p.what, "fix": p.fix} for p in self.problems],
        }


@dataclass
class _Host:
    """One host's process during a pass."""

    node: Node
    stage: str = ""
    pending: bytes = b""
    result: dict[str, Any] | None = None
    returncode: int | None = None
    stderr: list[str] = field(default_factory=list)
    done: bool = False
    joined_at: float | None = None  # when it said it joined the group (time.monotonic())

    def feed_out(self, data: bytes) -> None:
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace")
            if line.startswith(STAGE):
                self.stage = line[len(STAGE) :].strip()
                if self.stage == "joined":
                    self.joined_at = time.monotonic()
            elif line.startswith(RESULT):
                self.result = json.loads(line[len(RESULT) :])

    def feed_err(self, data: bytes) -> None:
        lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
        self.stderr = (self.stderr + lines)[-20:]


class Measurement:
    """The passes over connected nodes: probe, start, watch, stop."""

    def __init__(self, config: LaunchConfig, job: Loop) -> None:
        """`job`: the loop of the job (or of `distrun check`), whose --timeout bounds the measurement."""
        self.config = config
        self.deadline = job.deadline
        # The measurement's own loop, without the deadline: at --timeout the hosts still measuring are named
        # (`on_deadline` of each pass), not the whole check ended by a DeadlineReached.
        self.loop = Loop(job.wake_fd, check_every=job.check_every, control=job.control)
        self.cwd = os.getcwd()
        self.env = config.job_env(os.environ)
        self.source = WORKER.read_text(encoding="utf-8")
        self.run_id = os.urandom(6).hex()
        # Of the passes that succeeded: from START until the last host joined its group (torch's import).
        self.startup_s = 0.0

    def left(self) -> float:
        left = self.deadline.left(time.monotonic())
        return PASS_TIMEOUT if left is None else min(PASS_TIMEOUT, left)

    def run(
        self,
        nodes: Sequence[Node],
        rounds: Sequence[Round],
        *,
        compute: Collection[str],
        repeats: int,
        allreduce: bool,
    ) -> tuple[dict[str, dict[str, Any]], list[Finding]]:
        """One pass over `nodes` (the group, in rank order): the hosts in `compute` measure their compute,
        the pairs of `rounds` their links; each host's result, and the hosts whose process failed (the
        others of a failed pass have no result)."""
        rank = {node.name: i for i, node in enumerate(nodes)}
        budget = self.left()
        if budget <= 0:
            return {}, [
                Finding(n.name, "not measured: --timeout expired", "give --timeout more time") for n in nodes
            ]
        spec = {
            "rounds": [[[rank[a], rank[b]] for a, b in pairs] for pairs in rounds],
            "link_bytes": CPU_LINK_BYTES,
            "gpu_link_bytes": GPU_LINK_BYTES,
            "pings": PINGS,
            "link_repeats": repeats,
            "repeat_seconds": REPEAT_SECONDS,
            "compute_ranks": [rank[h] for h in compute if h in rank],
            "compute_seconds": COMPUTE_SECONDS,
            "compute_window": COMPUTE_WINDOW,
            "intra_bytes": INTRA_BYTES,
            "allreduce_bytes": CPU_ALLREDUCE_BYTES if allreduce else 0,
            "gpu_allreduce_bytes": GPU_ALLREDUCE_BYTES if allreduce else 0,
            "timeout": max(1.0, budget),
        }
        failed = self.start(nodes, spec)
        if failed:
            return {}, failed
        return self.watch(nodes, time.monotonic() + budget)

    def start(self, nodes: Sequence[Node], spec: dict[str, Any]) -> list[Finding]:
        """Probe (rank 0's host opens a port, every other host connects to it: the path the group's store
        takes), then START the measurement on every host; the hosts that cannot reach rank 0's, if any,
        and nothing started."""
        local = [n.local for n in nodes]
        master = backend.get(self.config.launcher).master_address(
            self.config.master_addr, local, [n.link for n in nodes]
        )
        if not master:
            raise HostError(f"host {nodes[0].name}: its address is unknown (a proxy); give --master-addr")
        python = interpreter(self.config.python)
        listen = ProbeRequest(ports=1, cwd=self.cwd, python=python, listen=True)
        [first] = probe(nodes[:1], [listen], PROBE_STALL, self.loop)
        requests = [
            ProbeRequest(
                ports=0,
                cwd=self.cwd,
                route_to=master,
                python=python,
                connect_to=master,
                connect_port=first.listen_port,
            )
            for _ in nodes[1:]
        ]
        facts = [first, *probe(nodes[1:], requests, PROBE_STALL, self.loop)]
        blocked = [
            Finding(
                n.name,
                f"cannot open a TCP connection to {nodes[0].name}:{f.tcp_port} ({f.tcp_error}), where the"
                " measurement's group meets",
                f"allow TCP from {n.name} to {nodes[0].name}: check nftables/iptables and security groups",
            )
            for n, f in zip(nodes[1:], facts[1:], strict=True)
            if f.tcp_error
        ]
        if blocked:
            return blocked
        addrs = tuple(
            master if i == 0 or all(local) else (f.route_addr or n.name)
            for i, (n, f) in enumerate(zip(nodes, facts, strict=True))
        )
        rdzv = Rendezvous(master, facts[0].free_ports[0], addrs, tuple((0,) for _ in nodes))
        hosts = [replace(n.host, slots=1) for n in nodes]
        plan = build_plan(PlanInputs(tuple(hosts), len(hosts)))
        config = replace(self.config, command=("distrun-perf",), gpus_per_rank=None)
        built = start_requests(
            config, plan, rdzv, self.env, local=local, facts=facts, placed=None, attempt=0,
            run_id=self.run_id, cwd=self.cwd, workers=(),
        )  # fmt: skip
        argument = json.dumps(spec)
        for node, found, request in zip(nodes, facts, built, strict=True):
            python = interpreter(self.config.python, found.python_found)
            ranks = [replace(r, argv=[python, "-c", self.source, argument]) for r in request.ranks]
            cwd = self.cwd if found.cwd_exists else "/"
            node.send(START, replace(request, ranks=ranks, cwd=cwd))
        return []

    def watch(self, nodes: Sequence[Node], until: float) -> tuple[dict[str, dict[str, Any]], list[Finding]]:
        hosts = [_Host(node) for node in nodes]
        started = time.monotonic()
        phase = Measuring(hosts, until)
        self.loop.run(phase)
        if phase.failed:
            return {}, phase.failed
        joined = [h.joined_at for h in hosts if h.joined_at is not None]
        if joined:
            self.startup_s += max(joined) - started
        return {h.node.name: h.result for h in hosts if h.result is not None}, []


class Measuring(Phase[_Host]):
    """The measurement's processes running, a phase of the job's loop: a host whose process fails or whose
    link closes is a finding (its measurement stopped everywhere), `until` names the hosts that got least
    far; a stopping signal stops every process and ends the check."""

    def __init__(self, hosts: Sequence[_Host], until: float) -> None:
        # No liveness rule of its own: a host's process that dies or a link that closes is heard, and a host
        # that goes quiet is named at `until` with how far it got.
        super().__init__([(h.node, h) for h in hosts], dead_after=float("inf"))
        self.hosts = list(hosts)
        self.until = until
        self.stopping_at: float | None = None
        self.failed: list[Finding] = []
        self.handlers = {
            OUT: lambda h, now, frame, _: h.feed_out(frame.payload),
            ERR: lambda h, now, frame, _: h.feed_err(frame.payload),
            EXIT: self._on_exit,
            DONE: self._on_done,
        }

    @property
    def done(self) -> bool:
        return all(h.done for h in self.hosts)

    def listening(self, context: _Host) -> bool:
        return not context.done

    def doing(self, now: float) -> str:
        return "measuring the hosts (check --perf)"

    def next_due(self) -> float | None:
        return self.stopping_at if self.stopping_at is not None else self.until

    def _stop(self, now: float) -> None:
        for h in self.hosts:
            if not h.done:
                h.node.send(KILL)
        self.stopping_at = now + KILL_WAIT

    def _fail(self, finding: Finding, now: float) -> None:
        if self.stopping_at is None:
            self.failed.append(finding)
            self._stop(now)

    def _on_exit(self, h: _Host, now: float, frame: Frame, message: RankExited) -> None:
        h.returncode = message.returncode
        if h.returncode != 0:
            self._fail(_crashed(h), now)

    def _on_done(self, h: _Host, now: float, frame: Frame, message: object) -> None:
        h.done = True

    def on_tick(self, now: float) -> None:
        if self.stopping_at is None and now >= self.until:
            self.failed += _stalled(self.hosts)
            self._stop(now)
        elif self.stopping_at is not None and now >= self.stopping_at:
            for h in self.hosts:  # agents that did not report their processes gone in time
                if not h.done:
                    h.node.drop()
                    h.done = True

    def on_closed(self, context: _Host, now: float) -> None:
        detail = context.node.diagnostics() or "connection closed"
        context.node.drop()
        context.done = True
        self._fail(Finding(context.node.name, f"lost during the measurement: {detail}", _FIX), now)

    def on_signals(self, received: bytes, now: float) -> None:
        if stops := stopping(received):
            self._stop(now)
            raise Interrupted.from_signals(stops)
        super().on_signals(received, now)

    def on_deadline(self, now: float, deadline: Deadline) -> None:
        """--timeout: the hosts still measuring are named as not measured in time, not a DeadlineReached."""
        self.until = min(self.until, now)


_FIX = "run `distrun check` on it; -v shows the measurement's output"


def _crashed(h: _Host) -> Finding:
    for line in h.stderr:
        log.info("host %s: measurement: %s", h.node.name, line)
    last = h.stderr[-1] if h.stderr else f"exit code {h.returncode}"
    if "No module named 'torch" in last:  # torch itself, or a torch without its distributed part
        return Finding(
            h.node.name,
            f"cannot run the measurement: {last}",
            "pip install torch there, or point --python at an interpreter that has it",
        )
    return Finding(h.node.name, f"the measurement failed: {last}", _FIX)


def _stalled(hosts: Sequence[_Host]) -> list[Finding]:
    """At the timeout: the hosts that got least far (the others were waiting for them), else every host
    still measuring."""
    late = [h for h in hosts if not h.done]
    if not late:
        return []

    def reached(h: _Host) -> int:
        return STAGES.index(h.stage) if h.stage in STAGES else len(STAGES)

    least = min(reached(h) for h in late)
    behind = [h for h in late if reached(h) == least]
    what = {
        0: "its measurement process did not start",
        1: "importing torch did not finish",
        2: "it did not join the others (a blocked port, or an unreachable address)",
    }.get(least, "the measurement did not finish")
    fix = "check TCP between the hosts (nftables/iptables, security groups) and --network-interface"
    return [Finding(h.node.name, f"{what} in time", fix) for h in behind]


def _figures(name: str, result: dict[str, Any]) -> HostFigures:
    gpus = tuple(Gpu(g["index"], g["name"], g["dtype"], g["tflops"]) for g in result.get("gpus", []))
    return HostFigures(
        name,
        backend=result.get("backend", "gloo"),
        compute_gflops=result.get("compute_GFLOPs"),
        gpus=gpus,
        intra_host_bps=result.get("intra_host_Bps"),
    )


def _samples(nodes: Sequence[Node], results: dict[str, dict[str, Any]], retest: bool) -> list[LinkSample]:
    """One sample per pair that both sides reported, from each side's own sending rate."""
    names = [n.name for n in nodes]
    sent: dict[tuple[str, str], dict[str, Any]] = {}
    for name, result in results.items():
        for entry in result.get("links", []):
            sent[(name, names[entry["partner"]])] = entry
    samples = []
    for (a, b), entry in sent.items():
        back = sent.get((b, a))
        if back is not None and names.index(a) < names.index(b):
            latency = min(entry["latency_s"], back["latency_s"])
            samples.append(LinkSample(a, b, entry["out_Bps"], back["out_Bps"], latency, retest))
    return samples


def measure(nodes: Sequence[Node], config: LaunchConfig, loop: Loop) -> PerfResult:
    """Measure every host of `nodes` (connected, agents up) and judge; HostError only for what is no one
    host's fault. It waits as the job's `loop` does: signals, Ctrl-Z and `distrun stacks` as in every other
    phase; the loop's --timeout names the hosts not measured in time instead of ending it."""
    started = time.monotonic()
    runner = Measurement(config, loop)
    active = list(nodes)
    problems: list[Finding] = []
    results: dict[str, dict[str, Any]] = {}
    rounds: tuple[Round, ...] = ()
    # A pass that failed is measured again without the hosts it named: at most twice, so the rest of the
    # hosts still get their figures when one cannot run.
    for _ in range(3):
        if not active:
            break
        rounds = matchings([n.name for n in active])
        names = [n.name for n in active]
        results, failed = runner.run(active, rounds, compute=names, repeats=REPEATS, allreduce=True)
        problems += failed
        if not failed or runner.left() <= 0:
            break  # at --timeout the others are not measured, and not named: they waited for those named
        gone = {f.host for f in failed}
        active = [n for n in active if n.name not in gone]
    samples = _samples(active, results, False)
    figures_by_host = [_figures(n.name, results[n.name]) for n in active if n.name in results]
    # Suspects are measured again before they are named: links against a host known to be good, compute
    # (CPU, GPUs, intra-host) on its own, while the others wait.
    retest_rounds: tuple[Round, ...] = ()
    suspected = suspects(samples)
    if suspected:
        figures = link_figures(samples)
        good = sorted(
            (h for h in figures.outbound if h not in suspected),
            key=lambda h: -min(figures.inbound[h], figures.outbound[h]),
        )
        retest_rounds = retests(suspected, good)
    slow = compute_suspects(figures_by_host)
    refs = references(figures_by_host, slow) if slow else []
    cleared: set[str] = set()
    if retest_rounds or slow:
        involved = {h for pairs in retest_rounds for pair in pairs for h in pair} | {*slow, *refs}
        group = [n for n in active if n.name in involved]
        log.info("perf: re-testing %s", ", ".join(dict.fromkeys([*suspected, *slow])))
        again, failed = runner.run(
            group, retest_rounds, compute=[*slow, *refs], repeats=RETEST_REPEATS, allreduce=False
        )
        if runner.left() > 0:  # a re-test cut short by --timeout blames nobody: its suspects stay named
            problems += failed
        samples += _samples(group, again, True)
        measured = [_figures(h, again[h]) for h in refs if h in again]
        cleared = {
            h for h in slow if h in again and measured and not still_slow(_figures(h, again[h]), measured)
        }
    found = [
        o for o in judge(figures_by_host, samples) if not (o.kind in COMPUTE_KINDS and o.host in cleared)
    ]
    return PerfResult(
        hosts=tuple(figures_by_host),
        samples=tuple(samples),
        outliers=tuple(found),
        problems=tuple(dict.fromkeys(problems)),
        # The slowest host's view: the all-reduce ends for everyone when it ends for the last one.
        allreduce_bps=min(
            (r["allreduce_Bps"] for r in results.values() if "allreduce_Bps" in r), default=None
        ),
        seconds=time.monotonic() - started,
        startup_s=runner.startup_s,
        rounds=len(rounds),
        retest_rounds=len(retest_rounds),
    )


def perf_lines(result: PerfResult, color: bool) -> list[str]:
    """The table (a row per host, the medians last), the all-host all-reduce, the outliers and problems,
    and one verdict line; on a terminal the outliers' figures in red."""
    import click

    from launcher.check.figures import PERF_HEADER, bad_cells, perf_rows, size
    from launcher.check.verdict import table

    rows = perf_rows(result.hosts, result.samples)
    bad = {(o.host, cell) for o in result.outliers for cell in bad_cells(o)}
    lines = table(rows, PERF_HEADER)
    out = [click.style(lines[0], bold=True) if color else lines[0]]
    widths = [max(len(r[i]) for r in (PERF_HEADER, *rows)) for i in range(len(PERF_HEADER))]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        if color:
            cells = [click.style(c, fg="red") if (row[0], i) in bad else c for i, c in enumerate(cells)]
        out.append("  ".join(cells).rstrip())
    if result.allreduce_bps is not None:
        backend_name = result.hosts[0].backend if result.hosts else "gloo"
        out.append(
            f"all-reduce over all {len(result.hosts)} hosts: {size(result.allreduce_bps)} bus bandwidth"
            f" ({backend_name})"
        )
    for o in result.outliers:
        out.append(click.style(o.line(), fg="red") if color else o.line())
    for p in result.problems:
        out.append(f"{p.host}: problem: {p.what}; fix: {p.fix}")
    named = result.named
    took = f"{plural(len(result.hosts), 'host', 'hosts')} measured in {result.seconds:.1f}s"
    final = (
        f"perf: {len(named)} named ({', '.join(named)}); {took}" if named else f"perf: nobody named; {took}"
    )
    out.append(click.style(final, fg="red" if named else "green", bold=True) if color else final)
    return out


def check_perf(config: LaunchConfig, hosts: Sequence[Host], color: bool) -> PerfResult:
    """`distrun check --perf` over `hosts` (those that passed the check): connect, measure, print."""
    import click

    from launcher.runtime.node import close_all, connect
    from launcher.signals import signal_pipe

    with signal_pipe() as wake_fd:
        # --timeout counts from here: reaching the hosts again, then the measurement.
        loop = Loop(wake_fd, deadline=Deadline(config.timeout, time.monotonic()), check_every=1.0)
        nodes = connect(hosts, config)
        try:
            result = measure(nodes, config, loop)
        finally:
            close_all(nodes)
    for line in perf_lines(result, color):
        click.echo(line)
    return result


def perf_after_check(config: LaunchConfig, passed: Sequence[Host], color: bool, ready: bool) -> int:
    """`distrun check --perf`'s second half: measure the hosts that passed; exit 0 when every host passed
    and nobody is named, else 3. --report gets the figures."""
    from launcher.errors import EXIT_HOST, EXIT_OK

    result = check_perf(config, passed, color) if passed else PerfResult()
    code = EXIT_OK if ready and not result.named else EXIT_HOST
    if config.report is not None:
        from launcher.report.account import build_report, write_report

        report = build_report(
            run_id=os.urandom(6).hex(),
            command=("distrun", "check", "--perf"),
            exit_code=code,
            attempts=[],
            failure=None,
            perf=result.record(),
        )
        write_report(config.report, report)
    return code
