"""The engine's costs per operation (``benchmarks/workers/engine_burst.py``), this tree against an earlier
one, alternating jobs in one run.

    python benchmarks/engine_burst.py --baseline DIR [--ranks 2] [--pairs 3] [--run 1] [--steps 0]

DIR is a ``git archive`` of an earlier tree, put first on ``PYTHONPATH`` for its jobs. For each tree it
prints, over all of its jobs' rounds (each round's time the slowest rank's): the 64-op burst against one
grouped call, and the grouped call against one raw ``all_reduce`` of all their bytes, as medians with
quartiles (> 1: slower), each case timed alone after a barrier (``--run N``: N calls in a row, timed
together), and the part of the burst spent in its ``allreduce_async_`` calls (what is left of it is its round
and its ``synchronize`` calls); Python calls per operation of the burst; with ``--steps N``, a step of
``--step-count`` cached named operations: the step's time (median and mean), the garbage collector's share,
rounds per step, the agreement's CPU per operation and the submitting thread's (ns).
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
from typing import Any

from common import REPO, WORKERS, distrun, env_with_repo


def quartiles(values: Sequence[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{median:.3f} ({q1:.3f}-{q3:.3f})"


def run_job(tree: Path | None, ranks: int, worker_args: Sequence[str]) -> dict[str, Any]:
    argv = [*distrun("-np", ranks), sys.executable, str(WORKERS / "engine_burst.py"), *worker_args]
    env = env_with_repo()
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env["PYTHONPATH"]])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, cwd=REPO).stdout
    for line in out.splitlines():
        _, _, text = line.partition("] ")
        if text.startswith("{"):
            result: dict[str, Any] = json.loads(text)
            return result
    raise RuntimeError(f"no result: {out}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="an earlier tree (git archive) to compare with")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=100, help="rounds of the burst per job (0: none)")
    parser.add_argument("--run", type=int, default=1, help="calls of each case in a row, timed together")
    parser.add_argument("--steps", type=int, default=0, help="cached steps per job (0: none)")
    parser.add_argument("--step-count", type=int, default=1000)
    args = parser.parse_args(argv)
    trees: dict[str, Path | None] = {"this tree": None}
    if args.baseline is not None:
        trees["baseline"] = args.baseline
    work = [
        f"--rounds={args.rounds}",
        f"--run={args.run}",
        f"--steps={args.steps}",
        f"--step-count={args.step_count}",
    ]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for pair in range(args.pairs):
        names = list(trees) if pair % 2 == 0 else list(trees)[::-1]
        for name in names:
            results[name].append(run_job(trees[name], args.ranks, work))
            if args.rounds and pair == 0:
                results[name][-1].update(run_job(trees[name], args.ranks, [*work, "--count-calls"]))
        print(f"pair {pair + 1} done", flush=True)
    print(f"\n{args.ranks} ranks, {args.pairs} jobs per tree, {args.run} call(s) of a case in a row")
    for name, jobs in results.items():
        print(f"{name}:")
        if args.rounds:
            burst = [r for job in jobs for r in zip(*job["burst"].values(), strict=True)]
            keys = list(jobs[0]["burst"])
            b, g, w = keys.index("burst"), keys.index("grouped"), keys.index("raw")
            for label, index in (("burst", b), ("grouped", g), ("raw", w)):
                print(f"  {label:8} ms  {quartiles([r[index] * 1e3 for r in burst])}")
            print(f"  burst / grouped   {quartiles([r[b] / r[g] for r in burst])}")
            s = keys.index("submitting")
            print(f"  the burst's submissions, ms   {quartiles([r[s] * 1e3 for r in burst])}")
            print(f"  the burst less them / grouped   {quartiles([(r[b] - r[s]) / r[g] for r in burst])}")
            print(f"  grouped / raw     {quartiles([r[g] / r[w] for r in burst])}")
            print(f"  Python calls per operation of the burst: {jobs[0]['python_calls_per_op']:.1f}")
        if args.steps:
            steps = [job["steps"] for job in jobs]
            seconds = [s * 1e3 for job in steps for s in job["seconds"]]
            rounds = [float(r) for job in steps for r in job["rounds"]]
            agreement = [a for job in steps for a in job["agreement_ns_per_op"]]
            collecting = [c * 1e3 for job in steps for c in job.get("collector_seconds", [0.0])]
            print(f"  step of {args.step_count} cached operations, ms   {quartiles(seconds)}")
            print(f"  the same, mean (with the collector's full passes)   {statistics.mean(seconds):.3f}")
            print(f"  garbage collector per step (rank 0), ms, mean   {statistics.mean(collecting):.3f}")
            print(f"  agreement rounds per step               {quartiles(rounds)}")
            print(f"  agreement CPU per operation, ns         {quartiles(agreement)}")
            print(f"  the same, mean                          {statistics.mean(agreement):.1f}")
            submitting = [n for job in steps for n in job.get("submit_ns_per_op", [])]
            if submitting:
                print(f"  submitting thread's CPU per operation, ns   {quartiles(submitting)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
