"""Seconds from a failure to the first training step of the new world: a reset in place (an elastic job whose
ranks use hvd.elastic) against a whole-job restart of the same job (its ranks never opt in, so distrun stops
and starts them all), side by side in one run, on simulated SSH hosts (tests/multihost/cluster.py: needs
root, iproute2 and openssh-server).

The job is a realistic start (benchmarks/workers/elastic_step.py: torch, a ResNet-50-sized model, a
DataLoader), 4 ranks: on 2 hosts of 2 slots and on 4 hosts of 1. Two failures of the last rank:

- `killed`: it SIGKILLs itself before step KILL_AT; detection is immediate, so the ratio measures recovery.
- `cut`: once it reaches step KILL_AT, its host's link is cut; detection takes the `--ssh-keepalive` limit
  (keepalive x 5) in both modes, so the difference is the same recovery as above.

Both modes run with `--min-np 2 --max-restarts 1`: the reset goes on with the survivors; the restart starts
every rank again, on every host for a killed rank, without the cut host. Recovery is the first step in the
new world (any rank) minus the failure, both on this machine's wall clock (the hosts are its namespaces).

    python benchmarks/elastic.py [--hosts 2 4] [--failures killed cut] [--pairs 1] [--kill-at 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import WORKERS, distrun, env_with_repo
from tests.multihost.cluster import Cluster, unavailable_reason

WORKER = WORKERS / "elastic_step.py"
RANKS = 4
KEEPALIVE_S = 1
MODES = {
    "reset in place": {},
    "whole-job restart": {"ELASTIC_PLAIN": "1"},
}


_RESET_LINE = re.compile(r"reset 1: .*training again ([0-9.]+)s after the failure")


class BenchmarkError(RuntimeError):
    pass


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise BenchmarkError(f"the job ended (exit {proc.returncode}) before {path.name} appeared")
        if time.monotonic() > deadline:
            raise BenchmarkError(f"no {path.name} within {timeout:.0f}s")
        time.sleep(0.1)  # a file another process writes: nothing to wait on but its appearance


def recovery(
    lab: Cluster, mode: dict[str, str], failure: str, kill_at: int, loader_workers: int
) -> tuple[float, float | None]:
    """Seconds from the failure to the first step in the new world; and for a reset, distrun's own figure
    (from the failure it saw to the new world's first collective, the state's sync)."""
    slots = RANKS // len(lab.hosts)
    hosts = ",".join(f"{host}:{slots}" for host in lab.hosts)
    extra = {"ELASTIC_VICTIM": str(RANKS - 1), "ELASTIC_FAILURE": failure}
    extra["LOADER_WORKERS"] = str(loader_workers)
    env = {**lab.env(**extra, **mode), "PYTHONPATH": env_with_repo()["PYTHONPATH"]}
    options = ("--min-np", "2", "--max-restarts", "1", "--restart-delay", "0")
    options += ("--ssh-keepalive", str(KEEPALIVE_S))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        argv = distrun("-H", hosts, "-np", str(RANKS), *options, WORKER, out, str(kill_at))
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        victim_host = lab.hosts[-1]
        try:
            if failure == "cut":
                _wait_for(out / "at", proc, timeout=600)
                lab.link_down(victim_host)
                failed_at = time.time()
                try:
                    _, err = proc.communicate(timeout=600)
                finally:
                    lab.link_up(victim_host)
            else:
                _, err = proc.communicate(timeout=600)
                failed_at = float((out / "killed").read_text())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if proc.returncode != 0:
            raise BenchmarkError(f"distrun exited {proc.returncode}: {err.decode()[-2000:]}")
        first = min(float(p.read_text()) for p in out.glob("step.*"))
    lab.wait_clean(timeout=60.0)
    said = _RESET_LINE.search(err.decode())
    return first - failed_at, float(said.group(1)) if said else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    parser.add_argument("--failures", nargs="+", default=["killed", "cut"], choices=["killed", "cut"])
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--kill-at", type=int, default=3)
    parser.add_argument("--loader-workers", type=int, default=1, help="the DataLoader's worker processes")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(f"elastic benchmark: no simulated cluster here: {reason}", file=sys.stderr)
        return 2
    for count in args.hosts:
        with Cluster(count) as lab:
            for failure in args.failures:
                samples: dict[str, list[float]] = {name: [] for name in MODES}
                synced: list[str] = []
                for _ in range(args.pairs):
                    for name, mode in MODES.items():  # interleaved: the machine's noise hits both alike
                        seconds, said = recovery(lab, mode, failure, args.kill_at, args.loader_workers)
                        samples[name].append(seconds)
                        if said is not None:
                            synced.append(f"{said:.2f}")
                medians = {name: statistics.median(values) for name, values in samples.items()}
                for name, values in samples.items():
                    shown = ", ".join(f"{v:.2f}" for v in values)
                    print(f"{count} hosts, {failure:6s} {name:18s} median {medians[name]:6.2f} s  ({shown})")
                said_s = ", ".join(synced)
                print(f"{count} hosts, {failure:6s} distrun's reset line, failure to synced: {said_s} s")
                reset, restart = medians.values()
                print(f"{count} hosts, {failure:6s} whole restart / reset in place: {restart / reset:.1f}x")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
