"""`distrun stacks` at scale: every rank's stacks and the verdict, 64 ranks on 16 simulated SSH hosts,
beside the time to read one rank (issue 38, item 4).

    sudo python benchmarks/stacks.py [--hosts 16] [--per-host 4] [--repeat 5] [--stack-tool python]

Needs root, iproute2 and openssh-server (it builds the simulated cluster of tests/multihost/cluster.py).
Two jobs run at once on the same cluster, each rank idle in its own code beside a helper thread
(benchmarks/workers/idle_threads.py): the big one, PER_HOST ranks on each of HOSTS hosts, and one of a
single rank on h1. `distrun stacks` asks each in turn, interleaved, REPEAT times: wall time from the command's
start to its whole answer (every rank's stacks, grouped, and the verdict), medians side by side, and their
ratio; then the same request made from this process (the job's answer alone, without the start of a Python
interpreter for the command, which on a loaded machine takes seconds by itself). Both jobs use --stack-tool
(python: faulthandler through the rank's hook; py-spy: native frames too, which need each library's symbols,
seconds for a torch rank). Every host runs on this same machine, so the
figures include 16 hosts' agents sharing its cores; a real cluster's hosts read their ranks in parallel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, WORKERS, distrun

from launcher.runtime.control import ask_stacks
from tests.multihost.cluster import Cluster, unavailable_reason

WORKER = WORKERS / "idle_threads.py"


def _ready(directory: Path, count: int, within: float = 300.0) -> None:
    deadline = time.monotonic() + within
    while len(list(directory.glob("*.pid"))) < count:
        if time.monotonic() > deadline:
            log = directory.with_suffix(".log").read_text()[-2000:]
            raise SystemExit(f"stacks benchmark: {count} ranks not ready within {within:g}s:\n{log}")
        time.sleep(0.1)


def _asked(pid: int, env: dict[str, str]) -> tuple[float, str]:
    """Seconds `distrun stacks PID` took, and its answer."""
    start = time.perf_counter()
    done = subprocess.run(distrun("stacks", str(pid)), capture_output=True, env=env, timeout=120)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"stacks benchmark: distrun stacks {pid}: {done.stderr.decode().strip()}")
    return took, done.stdout.decode()


def _answered(pid: int) -> float:
    """Seconds the job took to answer `distrun stacks`' request (from this process: no interpreter start)."""
    start = time.perf_counter()
    ask_stacks(pid, 120.0)
    return time.perf_counter() - start


def _start(hosts: str, ready: Path, tool: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The job, its console output in READY/../NAME.log (read should it fail)."""
    argv = distrun("-H", hosts, "--stack-tool", tool, WORKER, ready)
    with open(ready.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--per-host", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stack-tool", default="python", choices=["python", "py-spy", "auto"])
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(f"stacks benchmark: no simulated cluster here: {reason}", file=sys.stderr)
        return 2
    ranks = args.hosts * args.per_host
    with Cluster(args.hosts, login_rc=False) as cluster, tempfile.TemporaryDirectory() as tmp:
        runtime = Path(tmp) / "xdg"
        runtime.mkdir(mode=0o700)
        env = cluster.env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime))
        big_ready, one_ready = Path(tmp) / "big", Path(tmp) / "one"
        big_ready.mkdir()
        one_ready.mkdir()
        every = ",".join(f"{host}:{args.per_host}" for host in cluster.hosts)
        jobs = {
            "all": _start(every, big_ready, args.stack_tool, env),
            "one": _start("h1:1", one_ready, args.stack_tool, env),
        }
        try:
            _ready(big_ready, ranks)
            _ready(one_ready, 1)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # where ask_stacks finds the jobs' sockets
            samples: dict[str, list[float]] = {name: [] for name in jobs}
            answers: dict[str, list[float]] = {name: [] for name in jobs}
            verdicts: dict[str, str] = {}
            for _ in range(args.repeat):
                for name, job in jobs.items():  # interleaved: the machine's noise hits both alike
                    took, answer = _asked(job.pid, env)
                    samples[name].append(took)
                    answers[name].append(_answered(job.pid))
                    verdicts[name] = next(
                        line for line in answer.splitlines() if line.startswith("verdict: ")
                    )
        finally:
            for job in jobs.values():
                job.terminate()
            for job in jobs.values():
                try:
                    job.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.communicate()
    load = Path("/proc/loadavg").read_text().split()[0]
    print(
        f"stacks benchmark: --stack-tool {args.stack_tool}, {args.repeat} asks each, interleaved, load {load}"
    )
    for what, measured in (("distrun stacks", samples), ("the job's answer", answers)):
        medians = {name: statistics.median(values) for name, values in measured.items()}
        print(f"{what}:")
        for name, label in (("one", "1 rank on 1 host"), ("all", f"{ranks} ranks on {args.hosts} hosts")):
            shown = ", ".join(f"{v:.2f}" for v in measured[name])
            print(f"  {label:22s} median {medians[name]:5.2f} s  ({shown})")
        print(f"  {ranks} ranks / 1 rank: {medians['all'] / medians['one']:.1f}x")
    for name, verdict in verdicts.items():
        print(f"{name}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
