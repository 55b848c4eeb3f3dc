"""A chaos soak of elastic training: seeded random failures, host changes and diagnosis calls against one
`hvd.elastic` job on simulated SSH hosts (tests/multihost/cluster.py: needs root, iproute2, openssh-server),
for a bounded time, then checks of how it ended.

The job (benchmarks/workers/chaos_train.py) is a Horovod elastic script: TorchState committed every epoch, a
helper thread of its own, a DataLoader with a worker process. It runs one rank per host on HOSTS hosts from a
discovery script (`--min-np 2`, `--blacklist-cooldown-range 3 6`), and meanwhile, at random gaps, one of:

- `kill`: SIGKILL of a rank;
- `cut`: a host's link cut for 2-8 s, then back;
- `discovery`: the discovery script's answer drops a listed host or adds one it left out;
- `stop`: SIGSTOP of a rank for 1-4 s, then SIGCONT;
- `stacks`, `top`: `distrun stacks` and `distrun top --once` against the job (they must answer, and the job
  must go on).

Failures and cuts are only made while more than `--min-np` ranks run, so the job can always go on. At the end
the ranks are asked to stop at their next commit, and the soak checks:

- the job finished (exit 0), or failed by Horovod's rules (its summary names the rule);
- every rank of the last world holds the same weights at the same epoch;
- nothing is left on any host;
- `--report`'s resets match the events: every killed rank's reset is there, and every reset follows an event.

It prints one table row per seed, and the problems found.

    python benchmarks/chaos.py [--seeds 1 2 3] [--duration 300] [--hosts 4] [--gap 4 12] [-v]

A seed with problems keeps the job's log (at `distrun -v` with -v), its report and, for a job that did not
stop, every rank's stacks and `distrun top` taken before its Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import WORKERS, distrun, env_with_repo
from tests.multihost.cluster import Cluster, unavailable_reason

WORKER = WORKERS / "chaos_train.py"
MIN_NP = 2
KINDS = ("kill", "cut", "discovery", "stop", "stacks", "top")
# A killed rank's reset must be in the report within this many seconds (detection is immediate; a reset
# waits for the survivors' next collective and, with a cut link beside it, the keepalive limit).
RESET_WITHIN_S = 90.0
# Rules the job may end by, as its summary says them: a failure the soak made that Horovod's driver ends on.
RULES = ("--min-np", "--reset-limit", "--elastic-timeout", "every rank failed", "all ranks failed")


@dataclass
class Soak:
    """One seed's run: what was done when (wall clock), and what went wrong."""

    seed: int
    events: list[tuple[float, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    resets: int = 0
    restarts: int = 0
    exit_code: int | None = None
    final: str = ""
    seconds: float = 0.0

    def did(self, kind: str, what: str) -> None:
        self.events.append((time.time(), kind, what))

    def counts(self) -> str:
        got = collections.Counter(kind for _, kind, _ in self.events)
        return " ".join(f"{kind}={got[kind]}" for kind in KINDS)


class Job:
    """The running job, its hosts' answers and its rank processes."""

    def __init__(self, lab: Cluster, out: Path, rng: random.Random, step_s: float, verbose: bool) -> None:
        self.lab = lab
        self.out = out
        self.rng = rng
        self.listed = list(lab.hosts)
        self.hosts_file = out / "hosts"
        self._write_hosts()
        script = out / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        script.chmod(0o755)
        options = ["--host-discovery-script", str(script), "--min-np", str(MIN_NP)]
        options += ["--max-np", str(len(lab.hosts)), "--blacklist-cooldown-range", "3", "6"]
        options += ["--ssh-keepalive", "1", "--elastic-timeout", "120", "--report", str(out / "report.json")]
        options += ["-v"] if verbose else []
        env = {**lab.env(CHAOS_STEP_S=str(step_s)), "PYTHONPATH": env_with_repo()["PYTHONPATH"]}
        self.log = (out / "distrun.log").open("wb")
        argv = distrun("-np", str(len(lab.hosts)), *options, WORKER, out)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.env = env

    def _write_hosts(self) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{host}:1\n" for host in self.listed))
        tmp.replace(self.hosts_file)  # the script never reads half a file

    def ranks(self) -> list[tuple[int, str]]:
        """The rank processes alive now: (pid, host)."""
        alive = []
        for path in self.out.glob("pid.*"):
            pid = int(path.name.split(".")[1])
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and str(WORKER) in " ".join(proc.cmdline()):
                    alive.append((pid, path.read_text()))
            except psutil.Error:
                continue
        return sorted(alive)

    def wait_training(self, timeout: float = 300) -> None:
        """Until a rank committed once: a failure before the ranks opt in to hvd.elastic restarts the whole
        job, which is not what the soak is about."""
        deadline = time.monotonic() + timeout
        while self.running() and not any(self.out.glob("trained.*")) and time.monotonic() < deadline:
            time.sleep(0.2)  # files the ranks write: nothing to wait on but their appearance

    def running(self) -> bool:
        return self.proc.poll() is None

    def ask(self, *argv: str) -> tuple[int, str]:
        done = subprocess.run(
            distrun(*argv), capture_output=True, text=True, env=self.env, timeout=120, check=False
        )
        return done.returncode, (done.stdout + done.stderr).strip()

    def change_hosts(self) -> str:
        left_out = [h for h in self.lab.hosts if h not in self.listed]
        if left_out and (len(self.listed) <= MIN_NP or self.rng.random() < 0.5):
            host = self.rng.choice(left_out)
            self.listed.append(host)
            self._write_hosts()
            return f"added {host}"
        if len(self.listed) <= MIN_NP:
            return "none"
        host = self.rng.choice(self.listed)
        self.listed.remove(host)
        self._write_hosts()
        return f"dropped {host}"


def _event(job: Job, soak: Soak, kind: str) -> None:
    rng = job.rng
    ranks = job.ranks()
    if kind in ("kill", "cut", "stop") and len(ranks) <= MIN_NP:
        return
    if kind == "kill":
        pid, host = rng.choice(ranks)
        os.kill(pid, signal.SIGKILL)
        soak.did(kind, f"rank pid {pid} on {host}")
    elif kind == "stop":
        pid, host = rng.choice(ranks)
        held = rng.uniform(1, 4)
        os.kill(pid, signal.SIGSTOP)
        soak.did(kind, f"rank pid {pid} on {host} for {held:.1f}s")
        time.sleep(held)  # the length of the pause is the event itself
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    elif kind == "cut":
        _, host = rng.choice(ranks)
        held = rng.uniform(2, 8)
        job.lab.link_down(host)
        soak.did(kind, f"{host} for {held:.1f}s")
        try:
            time.sleep(held)  # the length of the outage is the event itself
        finally:
            job.lab.link_up(host)
    elif kind == "discovery":
        soak.did(kind, job.change_hosts())
    else:
        argv = ("stacks", "--wait", "60", str(job.proc.pid)) if kind == "stacks" else (
            "top", "--once", "--job", str(job.proc.pid), "--wait", "30"
        )  # fmt: skip
        code, text = job.ask(*argv)
        soak.did(kind, f"exit {code}")
        if code != 0 and job.running():
            soak.problems.append(f"`distrun {argv[0]}` exited {code} while the job ran: {text[-300:]}")
        if not job.running():
            soak.problems.append(f"the job ended during `distrun {argv[0]}`")


def _check_end(job: Job, soak: Soak) -> None:
    log = (job.out / "distrun.log").read_text(errors="replace")
    tail = log.strip().splitlines()[-8:]
    soak.exit_code = job.proc.returncode
    if soak.exit_code != 0:
        rule = next((r for r in RULES if any(r in line for line in tail)), None)
        soak.final = f"failed ({rule})" if rule else "failed"
        if rule is None:
            soak.problems.append(f"exit {soak.exit_code} by no rule of Horovod's: " + " | ".join(tail))
        return
    finals = [p.read_text().split() for p in job.out.glob("final.*")]
    digests = {(epoch, digest) for _, _, epoch, digest in finals}
    sizes = {int(size) for _, size, _, _ in finals}
    soak.final = f"finished, size {sizes.pop() if len(sizes) == 1 else sizes}"
    if len(digests) != 1:
        soak.problems.append(f"the last world's ranks differ: {sorted(digests)}")
    elif finals and len(finals) != int(finals[0][1]):
        soak.problems.append(f"{len(finals)} ranks wrote their weights, the world has {finals[0][1]}")


def _check_report(job: Job, soak: Soak) -> None:
    path = job.out / "report.json"
    if not path.exists():
        soak.problems.append("no --report written")
        return
    report = json.loads(path.read_text())
    resets = [datetime.fromisoformat(r["at"]).timestamp() for r in report["resets"]]
    soak.resets = len(resets)
    soak.restarts = int(report.get("restarts", 0))
    unmatched = [
        what
        for when, kind, what in soak.events
        if kind == "kill" and not any(when - 2 <= at <= when + RESET_WITHIN_S for at in resets)
    ]
    # A whole-job restart (a rank killed before the new world's ranks opted in again) also recovers a kill.
    if len(unmatched) > soak.restarts:
        soak.problems.append(f"no reset or restart in the report for the kills of {', '.join(unmatched)}")
    disruptive = [when for when, kind, _ in soak.events if kind in ("kill", "cut", "discovery", "stop")]
    for at in resets:
        if not any(when - 2 <= at <= when + RESET_WITHIN_S + 30 for when in disruptive):
            soak.problems.append(f"a reset at {at:.0f} follows no event")


def soak_one(
    lab: Cluster,
    seed: int,
    duration: float,
    gap: tuple[float, float],
    step_s: float,
    *,
    verbose: bool = False,
) -> Soak:
    soak = Soak(seed)
    rng = random.Random(seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="distrun-chaos-") as tmp:
        job = Job(lab, Path(tmp), rng, step_s, verbose)
        try:
            job.wait_training()
            while job.running() and time.monotonic() - started < duration:
                time.sleep(rng.uniform(*gap))  # the random gap between events is what the soak varies
                if job.running():
                    _event(job, soak, rng.choice(KINDS))
            if not job.running():
                soak.problems.append(f"the job ended (exit {job.proc.returncode}) before the soak did")
            (job.out / "stop").write_text("")
            try:
                job.proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                soak.problems.append("the job did not stop within 240 s of the stop request")
                # Where it hangs: every rank's stacks and the world as the job sees it, kept with its log.
                for name, argv in (
                    ("stacks", ("stacks", "--wait", "60")),
                    ("top", ("top", "--once", "--job")),
                ):
                    (job.out / f"{name}.txt").write_text(job.ask(*argv, str(job.proc.pid))[1] + "\n")
                job.proc.send_signal(signal.SIGINT)
                job.proc.wait(timeout=60)
            _check_end(job, soak)
            _check_report(job, soak)
            left = lab.wait_clean(timeout=30)
            if left:
                soak.problems.append(f"left running: {sorted(left)}")
        finally:
            if job.running():
                job.proc.kill()
                job.proc.wait()
            job.log.close()
            for host in lab.hosts:
                lab.link_up(host)
            if soak.problems:
                keep = Path(tempfile.mkdtemp(prefix=f"distrun-chaos-{seed}-log-"))
                for name in ("distrun.log", "report.json", "stacks.txt", "top.txt"):
                    if (job.out / name).exists():
                        (keep / name).write_bytes((job.out / name).read_bytes())
                soak.problems.append(f"the job's log, report and stacks: {keep}")
    soak.seconds = time.monotonic() - started
    return soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of events per seed")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gap", type=float, nargs=2, default=(4.0, 12.0), help="seconds between events")
    parser.add_argument("--step-s", type=float, default=0.05, help="the script's pause per step")
    parser.add_argument("-v", "--verbose", action="store_true", help="the job's log at distrun -v")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(f"chaos soak: no simulated cluster here: {reason}", file=sys.stderr)
        return 2
    soaks = []
    with Cluster(args.hosts) as lab:
        for seed in args.seeds:
            soak = soak_one(lab, seed, args.duration, tuple(args.gap), args.step_s, verbose=args.verbose)
            soaks.append(soak)
            print(
                f"seed {seed:4d}  {soak.seconds:6.0f}s  events: {soak.counts()}  resets {soak.resets:3d}  "
                f"restarts {soak.restarts}  "
                f"exit {soak.exit_code}  {soak.final}  problems {len(soak.problems)}",
                flush=True,
            )
            for problem in soak.problems:
                print(f"    {problem}", flush=True)
    total = sum(s.seconds for s in soaks)
    events = sum(len(s.events) for s in soaks)
    problems = sum(len(s.problems) for s in soaks)
    print(f"{len(soaks)} seeds, {total:.0f}s, {events} events, {sum(s.resets for s in soaks)} resets, "
          f"{problems} problems")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
