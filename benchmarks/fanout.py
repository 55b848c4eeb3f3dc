"""SSH fan-out: run a trivial command on 4, 16 and 32 simulated hosts, distrun against parallel OpenSSH.

    sudo python benchmarks/fanout.py [--hosts 4 16 32] [--repeat 5]

Needs root, iproute2 and openssh-server (it builds the simulated cluster of tests/multihost/cluster.py).
OpenSSH's side is `ssh host true &` for every host, then `wait`; distrun's is `distrun -H h1:1,...,hN:1 true`.
Besides wall time it reports the CPU time of the clients themselves (all `ssh` processes, or the distrun
process): every simulated host's sshd and login shell run on this same machine, so on a small machine the wall
time grows with the host count for reasons that are not the client's.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun, interleaved

from tests.multihost.cluster import Cluster, unavailable_reason


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def openssh_all(cluster: Cluster) -> float:
    start = time.perf_counter()
    procs = [
        subprocess.Popen([*cluster.ssh_argv(h, "true")], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for h in cluster.hosts
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("an OpenSSH client failed")
    return time.perf_counter() - start


def distrun_all(cluster: Cluster) -> float:
    hosts = ",".join(f"{h}:1" for h in cluster.hosts)
    start = time.perf_counter()
    subprocess.run(
        distrun("-H", hosts, "true"),
        check=True,
        stdout=subprocess.DEVNULL,
        env=cluster.env(PYTHONPATH=str(REPO)),
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot build the simulated cluster: {reason}")
    rows = []
    for n in args.hosts:
        with Cluster(n) as cluster:
            cpu = {"openssh": 0.0, "distrun": 0.0}

            def measured(
                name: str, run: Callable[[Cluster], float], c: Cluster = cluster, cpu: dict[str, float] = cpu
            ) -> float:
                before = children_cpu()
                wall = run(c)
                cpu[name] += children_cpu() - before
                return wall

            t = interleaved(
                {
                    "openssh": lambda: measured("openssh", openssh_all),
                    "distrun": lambda: measured("distrun", distrun_all),
                },
                args.repeat,
            )
        rows.append(
            (n, t["openssh"], t["distrun"], cpu["openssh"] / args.repeat, cpu["distrun"] / args.repeat)
        )
    print(
        f"{'hosts':>5}{'OpenSSH wall':>14}{'distrun wall':>14}{'ratio':>8}{'growth':>8}"
        f"{'OpenSSH cpu':>13}{'distrun cpu':>13}{'cpu growth':>12}"
    )
    first = rows[0]
    for n, ssh, dr, ssh_cpu, dr_cpu in rows:
        print(
            f"{n:>5}{ssh:>13.3f}s{dr:>13.3f}s{dr / ssh:>7.2f}x{dr / first[2]:>7.2f}x"
            f"{ssh_cpu:>12.2f}s{dr_cpu:>12.2f}s{dr_cpu / first[4]:>11.2f}x"
        )


if __name__ == "__main__":
    main()
