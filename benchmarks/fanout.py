"""SSH fan-out: run a trivial command on 4, 16 and 32 simulated hosts, distrun against parallel OpenSSH.

    sudo python benchmarks/fanout.py [--hosts 4 16 32] [--repeat 5]

Needs root, iproute2 and openssh-server (it builds the simulated cluster of tests/multihost/cluster.py).
OpenSSH's side is `ssh host true &` for every host, then `wait`; distrun's is `distrun -H h1:1,...,hN:1 true`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun, interleaved

from tests.multihost.cluster import Cluster, unavailable_reason


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
            cases = {"openssh": lambda c=cluster: openssh_all(c), "distrun": lambda c=cluster: distrun_all(c)}
            t = interleaved(cases, args.repeat)
        rows.append((n, t["openssh"], t["distrun"]))
    print(f"{'hosts':>5}{'OpenSSH parallel':>18}{'distrun':>10}{'distrun/OpenSSH':>17}{'distrun growth':>16}")
    for n, ssh, dr in rows:
        print(f"{n:>5}{ssh:>17.3f}s{dr:>9.3f}s{dr / ssh:>16.2f}x{dr / rows[0][2]:>15.2f}x")


if __name__ == "__main__":
    main()
