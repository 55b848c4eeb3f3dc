"""Horovod's synthetic benchmark (``benchmarks/workers/synthetic.py``): DistributedOptimizer against an
earlier tree's and against DDP, side by side.

    python benchmarks/synthetic.py --baseline DIR [--world-sizes 2 4] [--pairs 7]

DIR is a ``git archive`` of an earlier tree (the tree before the engine: b0ead4b), put first on
``PYTHONPATH`` for its runs. Each pair runs three jobs back to back, in rotating order: this tree's
DistributedOptimizer, the baseline's, and DDP (this tree's ``collectives.init``); the ratios are per pair
(> 1: this tree's optimizer is faster), reported as median and quartiles, and this tree's agreement rounds
per step and share of steps that went out unagreed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from common import REPO, WORKERS, distrun, env_with_repo

CASES = ("this tree", "baseline", "DDP")


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def run_job(case: str, ranks: int, baseline: Path | None, worker_args: Sequence[str]) -> dict[str, float]:
    argv = [*distrun("-np", ranks), sys.executable, str(WORKERS / "synthetic.py"), *worker_args]
    if case == "DDP":
        argv.append("--ddp")
    env = env_with_repo()
    if case == "baseline":
        assert baseline is not None
        env["PYTHONPATH"] = os.pathsep.join([str(baseline), env["PYTHONPATH"]])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, cwd=REPO).stdout
    for line in out.splitlines():
        _, _, text = line.partition("] ")
        if text.startswith("{"):
            result: dict[str, float] = json.loads(text)
            return result
    raise RuntimeError(f"no result from {case}: {out}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="an earlier tree (git archive) to compare with")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--worker-args", default="--image-size 32 --num-warmup-batches 10 --num-iters 7")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if c != "baseline" or args.baseline is not None]
    worker_args = args.worker_args.split()
    for ranks in args.world_sizes:
        samples: dict[str, list[float]] = {c: [] for c in cases}
        rounds: list[float] = []
        unagreed: list[float] = []
        for pair in range(args.pairs):
            order = cases[pair % len(cases) :] + cases[: pair % len(cases)]
            for case in order:
                result = run_job(case, ranks, args.baseline, worker_args)
                samples[case].append(result["img_s"])
                if case == "this tree" and "rounds_per_step" in result:
                    rounds.append(result["rounds_per_step"])
                if case == "this tree" and "unagreed_per_step" in result:
                    unagreed.append(result["unagreed_per_step"])
            print(
                f"{ranks} ranks, pair {pair + 1}: "
                + ", ".join(f"{c} {samples[c][-1]:.1f}" for c in cases)
                + " img/s",
                flush=True,
            )
        print(f"\n{ranks} ranks, {args.pairs} pairs: img/s median (quartiles)")
        for case in cases:
            q1, median, q3 = quartiles(samples[case])
            print(f"  {case:10} {median:8.1f} ({q1:.1f}-{q3:.1f})")
        mine = samples["this tree"]
        for other in cases[1:]:
            ratios = [a / b for a, b in zip(mine, samples[other], strict=True)]
            q1, median, q3 = quartiles(ratios)
            print(f"  DistributedOptimizer / {other}: {median:.3f} ({q1:.3f}-{q3:.3f})")
        if rounds:
            q1, median, q3 = quartiles(rounds)
            print(f"  this tree's agreement rounds per step (rank 0): {median:.2f} ({q1:.2f}-{q3:.2f})")
        if unagreed:
            q1, median, q3 = quartiles(unagreed)
            print(f"  this tree's steps that went out unagreed: {median:.2f} ({q1:.2f}-{q3:.2f})")
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
