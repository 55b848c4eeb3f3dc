"""The launcher's hot path: every row of issue 20's table, measured side by side in one run.

    sudo python benchmarks/hotpath.py [--rows noop gloo srun fanout fanout-own] [--baseline DIR]
                                      [--no-login-rc]

Rows (each interleaves its cases, so the shared machine's noise hits them alike):

  noop    a no-op 2-rank local job (`benchmarks/workers/noop.py`): seconds distrun adds over the same two
          workers started by hand with the environment set (median of 12 pairs)
  gloo    gloo init + barrier on 2 local ranks: distrun / by hand (median of 10 pairs)
  srun    6 no-op ranks on 3 real Slurm nodes inside `salloc`: distrun / one plain `srun` step (median of 5
          pairs; needs root and Slurm)
  fanout  128 simulated SSH hosts whose login shells read root's ~/.bashrc: `distrun -H ... true` / parallel
          OpenSSH `python3 -c pass` (needs root, iproute2, sshd; `--no-login-rc` hides the rc file); every
          host's login takes the same pyenv lock, as with a home on NFS (see benchmarks/fanout.py, --rc-lock)
  fanout-own  the same, each host with a pyenv lock of its own, as with local homes

`--baseline DIR` runs another checkout of distrun (`git archive main | tar -x -C DIR`) in every row, next to
this tree's, so before and after come from the same run.
"""

from __future__ import annotations

import argparse
import compileall
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, WORKERS, distrun, interleaved, timed_run
from startup import by_hand

ROWS = ("noop", "gloo", "srun", "fanout", "fanout-own")
# name: (worker script, pairs, figure, seconds added rather than a ratio, goal)
LOCAL_ROWS = {
    "noop": ("noop.py", 12, "no-op job, 2 local ranks", True, "<= +0.06 s"),
    "gloo": ("gloo_barrier.py", 10, "gloo init + barrier, 2 local ranks", False, "<= 1.03x"),
}


@dataclass(frozen=True)
class Row:
    figure: str
    reference: str  # what distrun is compared with
    ref_s: float
    trees: dict[str, float]  # "distrun" (this tree) and maybe "baseline": median seconds
    added: bool  # the figure is seconds added over the reference, not a ratio
    goal: str
    # Local rows: median CPU seconds of every process of a case (launcher, agent, ranks), reference included.
    # Unlike wall time, it hardly moves with the machine's load.
    cpu: dict[str, float] | None = None

    def cell(self, name: str) -> str:
        if name not in self.trees:
            return ""
        t = self.trees[name]
        text = f"+{t - self.ref_s:.3f} s ({t:.3f} s)" if self.added else f"{t / self.ref_s:.2f}x ({t:.2f} s)"
        if self.cpu:
            text += f"; CPU +{self.cpu[name] - self.cpu['hand']:.3f} s"
        return text


def local_row(
    script: Path, repeat: int, baseline: Path | None, *, figure: str, added: bool, goal: str
) -> Row:
    cases: dict[str, Callable[[], float]] = {
        "hand": lambda: by_hand(script),
        "distrun": lambda: timed_run(distrun("-np", "2", script), stderr=subprocess.DEVNULL),
    }
    if baseline is not None:
        cases["baseline"] = lambda: timed_run(
            distrun("-np", "2", script, tree=baseline), stderr=subprocess.DEVNULL
        )
    cpu: dict[str, list[float]] = {name: [] for name in cases}

    def with_cpu(name: str, case: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            before = _children_cpu()
            wall = case()
            cpu[name].append(_children_cpu() - before)
            return wall

        return run

    t = interleaved({name: with_cpu(name, case) for name, case in cases.items()}, repeat)
    cpu_s = {name: statistics.median(samples) for name, samples in cpu.items()}
    return Row(figure, "by hand", t.pop("hand"), t, added, goal, cpu_s)


def _children_cpu() -> float:
    """CPU seconds of every reaped descendant so far (the agent reaps the ranks, distrun the agent)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def srun_row(baseline: Path | None) -> Row:
    from slurm_launch import medians

    t = medians(5, baseline)
    return Row("6 no-op ranks, 3 Slurm nodes, in salloc", "one srun step", t.pop("srun"), t, False, "<= 1.3x")


def fanout_row(hosts: int, login_rc: bool, baseline: Path | None, rc_lock: str = "shared") -> Row:
    from fanout import distrun_all, openssh_all, run_cases

    cases = {
        "ssh python": lambda c: openssh_all(c, ["python3", "-c", "pass"]),
        "distrun": lambda c: distrun_all(c, []),
    }
    if baseline is not None:
        cases["baseline"] = lambda c: distrun_all(c, [], baseline)
    results = run_cases(hosts, cases, 1, login_rc, rc_lock)
    for name, sample in results.items():
        if sample.error:
            print(f"fanout {name}: {sample.error}", file=sys.stderr)
    ref = results.pop("ssh python").wall
    rc = f"login rc, {rc_lock} pyenv lock" if login_rc else "no login rc"
    return Row(
        f"fan-out, {hosts} SSH hosts, {rc}",
        "OpenSSH `python3 -c pass`",
        ref,
        {name: s.wall for name, s in results.items()},
        False,
        "<= 1.0x",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--baseline", type=Path, help="another distrun checkout to run alongside")
    parser.add_argument("--fanout-hosts", type=int, default=128)
    parser.add_argument("--login-rc", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    baseline = args.baseline.resolve() if args.baseline else None
    # An installed distrun has its bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 would recompile.
    for tree in filter(None, (REPO, baseline)):
        compileall.compile_dir(tree / "launcher", quiet=1)
    rows: list[Row] = []
    for name in args.rows:
        if name in LOCAL_ROWS:
            script, repeat, figure, added, goal = LOCAL_ROWS[name]
            rows.append(local_row(WORKERS / script, repeat, baseline, figure=figure, added=added, goal=goal))
        elif name == "srun":
            rows.append(srun_row(baseline))
        else:
            lock = "per-host" if name == "fanout-own" else "shared"
            rows.append(fanout_row(args.fanout_hosts, args.login_rc, baseline, lock))
        row = rows[-1]
        print(
            f"{row.figure}: {row.reference} {row.ref_s:.3f} s, distrun {row.cell('distrun')}", file=sys.stderr
        )
    head = (
        "| figure | reference | distrun |"
        + (f" baseline ({baseline.name}) |" if baseline else "")
        + " goal |"
    )
    print(head)
    print("|---" * head.count(" |") + "|")
    for row in rows:
        cells = [row.figure, f"{row.reference}: {row.ref_s:.3f} s", row.cell("distrun")]
        if baseline:
            cells.append(row.cell("baseline"))
        print("| " + " | ".join([*cells, row.goal]) + " |")


if __name__ == "__main__":
    main()
