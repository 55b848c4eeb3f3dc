"""SSH fan-out: start something on every simulated host, distrun against parallel OpenSSH clients.

    sudo python benchmarks/fanout.py [--hosts 32 128 256] [--repeat 1] [--no-login-rc] [--baseline DIR]

Needs root, iproute2 and openssh-server (it builds the simulated cluster of tests/multihost/cluster.py).
Cases, run side by side on the same cluster, interleaved when repeated:

  ssh true     one OpenSSH client per host, all started at once, each running `true`: the floor of SSH itself
  ssh python   the same clients running `python3 -c pass`: the fair comparison, since distrun starts a Python
               agent on every host
  distrun      `distrun -H h1:1,...,hN:1 true`: connect, start the agent, probe, run `true`, collect exits
  baseline     the same through another checkout of distrun (`--baseline DIR`, e.g. `git archive main`)

The hosts' login shells read root's ~/.bashrc as a real cluster's do (here it runs `pyenv init`, which takes
one global lock per login); `--no-login-rc` hides it, which flatters every launcher.

`--rc-lock` says whose lock that is. `shared` (the default): one ~/.pyenv for every host, as with a home on
NFS; the logins then run one at a time, and here the others' polling of the lock (`sleep 0.1` in a loop)
shares the 2 cores with the one holding it, so the more logins wait at once, the slower each goes: a launcher
that starts the logins sooner loses, which no real cluster's hosts (each polling on its own cores) would show.
`per-host`: every host has its own pyenv shims directory, hence its own lock, as with local homes.

Besides wall time it reports the CPU time and peak RSS of the client side only (the `ssh` processes together,
or the one distrun process), per host, and the CPU time spent on the hosts' side per host ("host cpu": how
long this machine's cores were busy during the case beyond the client's own CPU: sshd's sessions, the login
shells, the agents or interpreters, and whatever else runs here meanwhile, so measure on a quiet machine).
Every simulated host runs on this same machine, so on a small machine the wall time grows with the host
count for reasons that are not the client's.
A failing case is reported with its first error line instead of a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun

from tests.multihost.cluster import Cluster, unavailable_reason


@dataclass(frozen=True)
class Sample:
    wall: float
    cpu: float  # seconds, user + system, of the client processes and their descendants
    host_cpu: float  # seconds the machine's cores were busy beyond the client's own (the hosts' side)
    peak_rss_kib: int  # of the largest single client process
    processes: int  # client processes: one per host for OpenSSH, one in all for distrun
    error: str | None = None

    def rss_per_host_mib(self, hosts: int) -> float:
        return self.peak_rss_kib * self.processes / hosts / 1024


def _reap(procs: Sequence[subprocess.Popen[bytes]]) -> tuple[float, int, list[int]]:
    """Wait for each process with wait4, so that its own resource usage (not all children's) is known."""
    cpu, rss, codes = 0.0, 0, []
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it is reaped
        cpu += usage.ru_utime + usage.ru_stime
        rss = max(rss, usage.ru_maxrss)
        codes.append(proc.returncode)
    return cpu, rss, codes


def machine_cpu() -> float:
    """CPU seconds this machine's cores have been busy (every process: the hosts', the client's, others')."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system, irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def measured(cluster: Cluster, case: Callable[[Cluster], Sample]) -> Sample:
    """A case's sample with the hosts' CPU: what the machine spent meanwhile beyond the client's own.

    Not what the hosts' sshds reaped: an agent still ending when its session closes is re-parented and never
    counted there, which once showed distrun's hosts at a tenth of their real CPU.
    """
    cluster.wait_clean()
    before = machine_cpu()
    sample = case(cluster)
    cluster.wait_clean()  # the sessions' processes end a moment after the client
    return replace(sample, host_cpu=max(0.0, machine_cpu() - before - sample.cpu))


def openssh_all(cluster: Cluster, command: Sequence[str]) -> Sample:
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            cluster.ssh_argv(h, *command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for h in cluster.hosts
    ]
    cpu, rss, codes = _reap(procs)
    wall = time.perf_counter() - start
    failed = [(h, p) for h, p, code in zip(cluster.hosts, procs, codes, strict=True) if code != 0]
    error = None
    if failed:
        host, proc = failed[0]
        detail = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        last = detail.splitlines()[-1] if detail else "?"
        error = f"{len(failed)} of {len(procs)} clients failed; {host}: {last}"
    for proc in procs:
        if proc.stderr:
            proc.stderr.close()
    return Sample(wall, cpu, 0.0, rss, len(procs), error)


def distrun_all(cluster: Cluster, extra: Sequence[str], tree: Path | None = None) -> Sample:
    hosts = ",".join(f"{h}:1" for h in cluster.hosts)
    start = time.perf_counter()
    proc = subprocess.Popen(
        distrun("-H", hosts, *extra, "true", tree=tree),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=cluster.env(PYTHONPATH=str(REPO)),
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")  # read to the end first: a full pipe would block it
    proc.stderr.close()
    cpu, rss, codes = _reap([proc])
    wall = time.perf_counter() - start
    error = None
    if codes[0] != 0:
        lines = [line for line in err.splitlines() if "error" in line.lower()] or err.splitlines()[-1:]
        error = f"exit {codes[0]}: {lines[0] if lines else '?'}"
    return Sample(wall, cpu, 0.0, rss, 1, error)


def median(samples: Sequence[Sample]) -> Sample:
    errors = [s.error for s in samples if s.error]
    return Sample(
        statistics.median(s.wall for s in samples),
        statistics.median(s.cpu for s in samples),
        statistics.median(s.host_cpu for s in samples),
        max(s.peak_rss_kib for s in samples),
        samples[0].processes,
        errors[0] if errors else None,
    )


PYENV_SHIMS = Path("~root/.pyenv/shims").expanduser()


def own_pyenv_locks(cluster: Cluster) -> None:
    """Every host gets a copy of pyenv's shims directory, where `pyenv rehash` takes its lock."""
    if not PYENV_SHIMS.is_dir():
        return
    for host in cluster.hosts:
        shutil.copytree(PYENV_SHIMS, cluster.own_dir(host, PYENV_SHIMS), symlinks=True, dirs_exist_ok=True)


def run_cases(
    hosts: int,
    cases: dict[str, Callable[[Cluster], Sample]],
    repeat: int,
    login_rc: bool,
    rc_lock: str = "shared",
) -> dict[str, Sample]:
    """Every case on one cluster of `hosts` hosts, interleaved `repeat` times; the median sample of each."""
    samples: dict[str, list[Sample]] = {name: [] for name in cases}
    with Cluster(hosts, login_rc=login_rc) as cluster:
        if rc_lock == "per-host":
            own_pyenv_locks(cluster)
        for _ in range(repeat):
            for name, case in cases.items():
                samples[name].append(measured(cluster, case))
    return {name: median(s) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--login-rc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the hosts' login shells read root's ~/.bashrc, as a real cluster's do (Cluster's login_rc)",
    )
    parser.add_argument(
        "--rc-lock",
        choices=("shared", "per-host"),
        default="shared",
        help="one pyenv lock for every host's login (a shared home) or one per host (local homes)",
    )
    parser.add_argument("--distrun-arg", action="append", default=[], help="extra distrun option")
    parser.add_argument("--baseline", type=Path, help="another distrun checkout to run alongside")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot build the simulated cluster: {reason}")
    cases: dict[str, Callable[[Cluster], Sample]] = {
        "ssh true": lambda c: openssh_all(c, ["true"]),
        "ssh python": lambda c: openssh_all(c, ["python3", "-c", "pass"]),
        "distrun": lambda c: distrun_all(c, args.distrun_arg),
    }
    if args.baseline:
        cases["baseline"] = lambda c: distrun_all(c, args.distrun_arg, args.baseline.resolve())
    print(
        f"{'hosts':>5}  {'case':<11}{'wall':>9}{'vs ssh python':>15}{'cpu/host':>10}{'RSS/host':>10}"
        f"{'peak RSS':>10}{'host cpu/host':>15}  result"
    )
    for n in args.hosts:
        results = run_cases(n, cases, args.repeat, args.login_rc, args.rc_lock)
        ref = results["ssh python"].wall
        for name, r in results.items():
            print(
                f"{n:>5}  {name:<11}{r.wall:>8.2f}s{r.wall / ref:>14.2f}x{1000 * r.cpu / n:>8.1f}ms"
                f"{r.rss_per_host_mib(n):>8.2f}MB{r.peak_rss_kib / 1024:>8.1f}MB"
                f"{1000 * r.host_cpu / n:>13.1f}ms  {r.error or 'ok'}",
                flush=True,
            )


if __name__ == "__main__":
    main()
