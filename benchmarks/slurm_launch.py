"""Start-up inside a Slurm allocation: 6 no-op ranks on 3 nodes, distrun against a plain `srun` step.

    sudo python benchmarks/slurm_launch.py [--repeat 7]

Needs root and Slurm (it builds the real Slurm cluster of tests/slurm/cluster.py, then runs itself again under
`salloc -N3 --ntasks-per-node=2`). In the allocation it alternates `srun python -c pass` (one step of 6 tasks:
the least a Slurm user can do) with `distrun python -c pass` (one srun step per node, each starting an agent
that starts 2 ranks), and prints the median of each and their ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun, interleaved, timed_run

from tests.slurm.cluster import SlurmCluster, slurm_unavailable_reason

NOOP = [sys.executable, "-c", "pass"]


def inside_allocation(repeat: int) -> None:
    medians = interleaved(
        {
            "srun": lambda: timed_run(["srun", "--overlap", *NOOP], cwd=REPO),
            "distrun": lambda: timed_run(distrun(*NOOP), cwd=REPO),
        },
        repeat,
    )
    print("| ranks | srun (one step) | distrun | distrun / srun |")
    print("|---|---|---|---|")
    print(f"| 6 on 3 nodes | {medians['srun']:.3f} s | {medians['distrun']:.3f} s | "
          f"{medians['distrun'] / medians['srun']:.2f}x |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside_allocation(args.repeat)
        return
    reason = slurm_unavailable_reason()
    if reason is not None:
        raise SystemExit(reason)
    with SlurmCluster(3) as slurm:
        me = [sys.executable, __file__, "--inside", "--repeat", str(args.repeat)]
        subprocess.run(
            ["salloc", "--quiet", "-N3", "--ntasks-per-node=2", *me],
            check=True,
            env=slurm.env(PYTHONPATH=str(REPO)),
            cwd=REPO,
        )


if __name__ == "__main__":
    main()
