"""`distrun check --perf` over simulated hosts: how long the whole check takes at 4, 16 and 32 hosts.

    sudo python benchmarks/perf_check.py [--hosts 4 16 32] [--repeat 1] [--slow-link]

Needs root, iproute2 and openssh-server (it builds the simulated cluster of tests/multihost/cluster.py). Per
host count it reports the wall time of the whole command (SSH, the ordinary check, the measurement: torch's
import on every host, the rounds, the all-reduce, re-tests if any), that of the ordinary `distrun check`
alone on the same hosts just before, the time the measurement itself reports and how much of it was torch's
import and the group's start (`startup_s`), its rounds, and whom it named (nobody, on a healthy cluster).
`--slow-link` shapes h2's cable to 20 Mbit/s, as the worst case for the rounds (every transfer with h2 takes
~1.7 s each way, and h2 is re-tested).

Every simulated host runs on this one machine: torch is imported by every host at once on the same cores
(twice: by the ordinary check's probe and by the measurement process), which a real cluster's hosts do side
by side, so the wall time here grows with the host count for reasons no real cluster shows; the compute
figures are those of shared cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun

from tests.multihost.cluster import Cluster, unavailable_reason


def one(hosts: int, slow_link: bool) -> dict[str, object]:
    with Cluster(hosts, login_rc=False) as cluster, tempfile.TemporaryDirectory() as tmp:
        if slow_link:
            cluster.shape_link("h2", "20mbit")
        report = Path(tmp) / "perf.json"

        def timed(*args: object) -> tuple[subprocess.CompletedProcess[str], float]:
            started = time.monotonic()
            result = subprocess.run(
                distrun(*args, "-H", ",".join(cluster.hosts)),
                capture_output=True,
                text=True,
                env=cluster.env(PYTHONPATH=str(REPO)),
                cwd=REPO,
                timeout=600,
            )
            return result, time.monotonic() - started

        # The ordinary check alone first, on the same hosts: what --perf adds is the difference.
        _, check_wall = timed("check")
        result, wall = timed("check", "--perf", "--report", report)
        if not report.exists():
            return {"hosts": hosts, "wall_s": round(wall, 1), "error": result.stderr.strip()[-300:]}
        perf = json.loads(report.read_text())["perf"]
        if "--verbose" in sys.argv:
            print(result.stdout, file=sys.stderr)
        return {
            "hosts": hosts,
            "exit": result.returncode,
            "wall_s": round(wall, 1),
            "check_alone_s": round(check_wall, 1),
            "measurement_s": perf["seconds"],
            "startup_s": perf["startup_s"],
            "rounds": perf["rounds"],
            "retest_rounds": perf["retest_rounds"],
            "named": [f"{o['host']} ({o['kind']})" for o in perf["outliers"]]
            + [f"{p['host']} ({p['what']})" for p in perf["problems"]],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--slow-link", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="also print the check's output")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        sys.exit(f"cannot build the simulated cluster: {reason}")
    for hosts in args.hosts:
        for _ in range(args.repeat):
            print(json.dumps(one(hosts, args.slow_link)), flush=True)


if __name__ == "__main__":
    main()
