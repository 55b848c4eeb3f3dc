"""Seconds from a failure to the first training step of the new world: a reset in place (an elastic job whose
ranks use hvd.elastic, `--min-np`) against a whole-job restart (`--max-restarts 1`) of the same job, side by
side in one run, on local ranks (`-H localhost:3 -np 3`).

The job is a realistic start (benchmarks/workers/elastic_step.py: torch, a ResNet-50-sized model, a
DataLoader); rank 2 SIGKILLs itself before step KILL_AT. Recovery is the survivors' (or the restarted
ranks') first step in the new world minus the kill, both on the wall clock of this one machine.

    python benchmarks/elastic.py [--pairs 3] [--kill-at 4] [--loader-workers 1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import WORKERS, distrun, env_with_repo

WORKER = WORKERS / "elastic_step.py"
MODES = {
    "reset in place (--min-np 2)": ("--min-np", "2"),
    "whole-job restart (--max-restarts 1)": ("--max-restarts", "1", "--restart-delay", "0"),
}


def recovery(mode: tuple[str, ...], kill_at: int, loader_workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        argv = distrun("-H", "localhost:3", "-np", "3", *mode, WORKER, out, str(kill_at))
        subprocess.run(
            argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_with_repo()
        )
        killed = float((out / "killed").read_text())
        first = min(float(p.read_text()) for p in out.glob("step.*"))
        return first - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=4)
    parser.add_argument("--loader-workers", type=int, default=1, help="the DataLoader's worker processes")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(args.pairs):
        for name, mode in MODES.items():  # interleaved: the machine's noise hits both alike
            samples[name].append(recovery(mode, args.kill_at, args.loader_workers))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, values in samples.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:40s} median {medians[name]:6.2f} s  ({shown})")
    reset, restart = medians.values()
    print(f"whole restart / reset in place: {restart / reset:.1f}x")


if __name__ == "__main__":
    main()
