"""Start-up inside a Slurm allocation: 6 no-op ranks on 3 nodes, distrun against a plain `srun` step.

    sudo python benchmarks/slurm_launch.py [--repeat 5] [--baseline DIR]

Needs root and Slurm (it builds the real Slurm cluster of tests/slurm/cluster.py, then runs itself again under
`salloc -N3 --ntasks-per-node=2`). In the allocation it alternates `srun python -c pass` (one step of 6 tasks:
the least a Slurm user can do) with `distrun python -c pass` (every node's agent started by srun, each agent
starting 2 ranks), and prints the median of each and their ratio. `--baseline DIR` runs another checkout of
distrun (e.g. `git archive main | tar -x -C DIR`) alongside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun, timed_run

from tests.slurm.cluster import SlurmCluster, slurm_unavailable_reason

NOOP = [sys.executable, "-c", "pass"]


def inside_allocation(repeat: int, baseline: Path | None) -> dict[str, list[float]]:
    cases = {
        "srun": lambda: timed_run(["srun", "--overlap", *NOOP], cwd=REPO, stderr=subprocess.DEVNULL),
        "distrun": lambda: timed_run(distrun(*NOOP), cwd=REPO, stderr=subprocess.DEVNULL),
    }
    if baseline is not None:
        cases["baseline"] = lambda: timed_run(
            distrun(*NOOP, tree=baseline), cwd=REPO, stderr=subprocess.DEVNULL
        )
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):  # the cases alternate within each round, so machine noise hits them alike
        for name, case in cases.items():
            samples[name].append(case())
    return samples


def medians(repeat: int, baseline: Path | None = None) -> dict[str, float]:
    """Median seconds per case of `samples`."""
    return {name: statistics.median(values) for name, values in samples(repeat, baseline).items()}


def samples(repeat: int, baseline: Path | None = None) -> dict[str, list[float]]:
    """Builds a 3-node Slurm cluster and measures inside `salloc` there; each case's seconds per round."""
    reason = slurm_unavailable_reason()
    if reason is not None:
        raise SystemExit(reason)
    me = [sys.executable, __file__, "--inside", "--repeat", str(repeat)]
    if baseline is not None:
        me += ["--baseline", str(baseline.resolve())]
    with SlurmCluster(3) as slurm:
        done = subprocess.run(
            ["salloc", "--quiet", "-N3", "--ntasks-per-node=2", *me],
            check=True,
            env=slurm.env(PYTHONPATH=str(REPO)),
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
    return {name: list(values) for name, values in json.loads(done.stdout.decode().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another distrun checkout to run alongside")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(inside_allocation(args.repeat, args.baseline)))
        return
    t = medians(args.repeat, args.baseline)
    print(
        "| ranks | srun (one step) | distrun | distrun / srun |"
        + (" baseline / srun |" if "baseline" in t else "")
    )
    print("|---|---|---|---|" + ("---|" if "baseline" in t else ""))
    row = f"| 6 on 3 nodes | {t['srun']:.3f} s | {t['distrun']:.3f} s | {t['distrun'] / t['srun']:.2f}x |"
    if "baseline" in t:
        row += f" {t['baseline'] / t['srun']:.2f}x ({t['baseline']:.3f} s) |"
    print(row)


if __name__ == "__main__":
    main()
