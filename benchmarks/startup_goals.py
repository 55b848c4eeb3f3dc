"""Start-up goals (issue 39, goal 4), each as a ratio or a difference with quartiles, this tree and another
side by side in one run.

    python benchmarks/startup_goals.py --baseline DIR [--imports 21] [--jobs 12]
    sudo python benchmarks/startup_goals.py --baseline DIR --slurm 5

DIR is another checkout of distrun, e.g. `git archive main | tar -x -C DIR`. Rows, each interleaved (every
round runs each case once, so the shared machine's noise hits them alike):

  import   the launch path's import (`import launcher.cli.main, launcher.job.launch`, as the `distrun`
           command makes it, with its warm caches), each in a fresh interpreter: the process's wall time
           (median and quartiles of N), and the same less a bare interpreter (its own start, `site`
           included) of the same round; both end as distrun does, without the interpreter's teardown.
           Goal: <= 120 ms. Beside them, the modules outside distrun that the launch path loads (click's
           and the standard library's), imported alone: the floor under any work on distrun's own.
  agent    the shipped agent (what every SSH host and Slurm node runs: the bootstrap with the sources on
           stdin) from its start until its HELLO, with a warm code cache (a host's second launch on).
  no-op    a no-op 2-rank local job (`benchmarks/workers/noop.py`): distrun's wall time less the same two
           workers started by hand, per round. Goal: <= +0.06 s.
  slurm    6 no-op ranks on 3 real Slurm nodes inside `salloc`: distrun / one plain `srun` step, per round
           (needs root and Slurm; see benchmarks/slurm_launch.py). Goal: <= 1.3x.

Each local row also prints the CPU seconds of every process of a case (user + system, from getrusage of the
reaped children), which a loaded machine moves far less than wall time. Quartiles are of the per-round
figures (a difference or a ratio within one round), not of the raw times.
"""

from __future__ import annotations

import argparse
import base64
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, WORKERS, distrun, env_with_repo, timed_run
from startup import by_hand

IMPORT = "import launcher.cli.main, launcher.job.launch"
# How distrun ends (launcher.cli.main.entry): without the interpreter's teardown, which would free every
# module imported, a cost of the exit that distrun never pays, not of the import.
EXIT = "os._exit(0)"


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile)."""
    if len(values) < 2:
        return (values[0],) * 3
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def rounds(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Each case's wall seconds per round, and (as "NAME cpu") the CPU seconds of every process it ran and
    reaped (launcher, agent, ranks), which a loaded machine moves far less; the cases alternate within a
    round."""
    samples: dict[str, list[float]] = {key: [] for name in cases for key in (name, f"{name} cpu")}
    for _ in range(repeat):
        for name, case in cases.items():
            before = _children_cpu()
            samples[name].append(case())
            samples[f"{name} cpu"].append(_children_cpu() - before)
    return samples


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trees(baseline: Path | None) -> dict[str, Path | None]:
    return {"this tree": None, **({"baseline": baseline} if baseline is not None else {})}


def import_argv(tree: Path | None) -> list[str]:
    """A fresh interpreter importing the launch path of `tree` (None: this checkout) as the `distrun`
    command does (its argv[0] says so: what the package does first for the command, its caches included, is
    part of it), from `/` so that no working directory on sys.path picks another tree."""
    root = str(tree if tree is not None else REPO)
    code = f"import os, sys; sys.path.insert(0, {root!r}); sys.argv[0] = 'distrun'; {IMPORT}; {EXIT}"
    return [sys.executable, "-c", code]


def dependency_modules() -> list[str]:
    """The modules outside distrun that importing this tree's launch path loads and a bare interpreter has
    not: click's and the standard library's (logging, dataclasses, socket, ...), asked of a fresh one."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); sys.argv[0] = 'distrun'; before = set(sys.modules); "
        f"{IMPORT}; print(' '.join(sorted(m for m in set(sys.modules) - before "
        "if m.partition('.')[0] not in ('launcher', 'collectives'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd="/")
    return done.stdout.split()


def import_row(repeat: int, baseline: Path | None) -> dict[str, list[float]]:
    """The launch path's import of each tree, a bare interpreter, and (as "dependencies") a fresh
    interpreter importing only the modules outside distrun that the launch path loads: the floor that no
    work on distrun's own modules goes below."""
    imports = "; ".join(f"import {name}" for name in dependency_modules())
    cases: dict[str, Callable[[], float]] = {
        "bare": lambda: timed_run([sys.executable, "-c", f"import os; {EXIT}"], cwd="/"),
        "dependencies": lambda: timed_run([sys.executable, "-c", f"import os; {imports}; {EXIT}"], cwd="/"),
    }
    for name, tree in trees(baseline).items():
        cases[name] = lambda tree=tree: timed_run(import_argv(tree), cwd="/")  # type: ignore[misc]
    return rounds(cases, repeat)


def agent_row(repeat: int, baseline: Path | None) -> dict[str, list[float]]:
    """Each tree's shipped agent (as every SSH host and Slurm node starts it: the bootstrap, the sources on
    stdin), from its start until its HELLO, with a warm code cache, as on a host's second launch."""
    cases: dict[str, Callable[[], float]] = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, tree in trees(baseline).items():
            args, sources = _shipped(tree)
            cases[name] = lambda args=args, sources=sources: _agent_until_hello(args, sources, cache)  # type: ignore[misc]
            cases[name]()  # fills the code cache
        return rounds(cases, repeat)


def _shipped(tree: Path | None) -> tuple[list[str], bytes]:
    """`tree`'s bootstrap arguments and the sources it reads, asked of that tree in a process of its own."""
    code = (
        "import base64, json, sys; from launcher.backends.bootstrap import bootstrap_args, shipped_sources; "
        "s = shipped_sources(); "
        "print(json.dumps([bootstrap_args(s), base64.b64encode(b''.join(s)).decode()]))"
    )
    root = str(tree if tree is not None else REPO)
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        cwd="/",
        env={**os.environ, "PYTHONPATH": root},
    )
    args, sources = json.loads(done.stdout)
    return list(args), base64.b64decode(sources)


def _agent_until_hello(args: Sequence[str], sources: bytes, cache: str) -> float:
    env = {"PATH": os.environ.get("PATH", ""), "DISTRUN_CACHE_DIR": cache}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/", env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(sources)
    proc.stdin.flush()
    seen = b""
    while b"distrun-agent" not in seen:  # MAGIC, then HELLO
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise SystemExit(f"the agent ended before its HELLO: {args[:1]}")
        seen += chunk
    took = time.perf_counter() - start
    proc.stdin.close()
    proc.wait()
    return took


def noop_row(repeat: int, baseline: Path | None) -> dict[str, list[float]]:
    script = WORKERS / "noop.py"
    cases: dict[str, Callable[[], float]] = {"hand": lambda: by_hand(script)}
    for name, tree in trees(baseline).items():
        cases[name] = lambda tree=tree: timed_run(  # type: ignore[misc]
            distrun("-np", "2", script, tree=tree), stderr=subprocess.DEVNULL, env=env_with_repo()
        )
    return rounds(cases, repeat)


def slurm_row(repeat: int, baseline: Path | None) -> dict[str, list[float]]:
    from slurm_launch import samples

    t = samples(repeat, baseline)
    return {"srun": t["srun"], "this tree": t["distrun"], **({"baseline": t["baseline"]} if baseline else {})}


def show(label: str, values: Sequence[float], unit: str) -> str:
    """`label`, the median and (the quartiles) of `values`, in milliseconds, seconds added or a ratio."""
    q1, q2, q3 = quartiles(values)
    if unit == "ms":
        figure = f"{q2 * 1000:.1f} ms ({q1 * 1000:.1f}-{q3 * 1000:.1f})"
    elif unit == "+s":
        figure = f"{q2:+.3f} s ({q1:+.3f} to {q3:+.3f})"
    else:
        figure = f"{q2:.2f}x ({q1:.2f}-{q3:.2f})"
    return f"{label} {figure}" if label else figure


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, help="another distrun checkout to run alongside")
    parser.add_argument("--imports", type=int, default=21, help="rounds of the import row (0: skip it)")
    parser.add_argument("--agents", type=int, default=21, help="rounds of the agent row (0: skip it)")
    parser.add_argument("--jobs", type=int, default=12, help="rounds of the no-op job row (0: skip it)")
    parser.add_argument("--slurm", type=int, default=0, help="rounds of the Slurm row (root; 0: skip it)")
    args = parser.parse_args()
    baseline = args.baseline.resolve() if args.baseline else None
    # An installed distrun has its bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 would recompile.
    for tree in filter(None, (REPO, baseline)):
        compileall.compile_dir(tree / "launcher", quiet=1)
    names = list(trees(baseline))
    lines = ["| figure | reference (median, quartiles) | " + " | ".join(names) + " | goal |"]
    lines.append("|---" * (len(names) + 3) + "|")
    if args.imports:
        t = import_row(args.imports, baseline)
        cells = [show("", t[n], "ms") + "; " + show("less bare", _less(t[n], t["bare"]), "ms") for n in names]
        figure = f"launch path's import ({args.imports} rounds)"
        lines.append(_line(figure, show("bare", t["bare"], "ms"), cells, "<= 120 ms"))
        cells = [
            show("", t[f"{n} cpu"], "ms")
            + "; "
            + show("less bare", _less(t[f"{n} cpu"], t["bare cpu"]), "ms")
            for n in names
        ]
        lines.append(_line("the same, CPU", show("bare", t["bare cpu"], "ms"), cells, ""))
        floor = show("less bare", _less(t["dependencies"], t["bare"]), "ms")
        cells = [floor, *[""] * (len(names) - 1)]  # this tree's modules; the reference of both
        lines.append(_line("its modules outside distrun alone (click, the standard library)", "", cells, ""))
    if args.agents:
        t = agent_row(args.agents, baseline)
        cells = [show("", t[n], "ms") + "; CPU " + show("", t[f"{n} cpu"], "ms") for n in names]
        lines.append(_line(f"a shipped agent's start to its HELLO ({args.agents} rounds)", "", cells, ""))
    if args.jobs:
        t = noop_row(args.jobs, baseline)
        cells = [show("", _less(t[n], t["hand"]), "+s") for n in names]
        figure = f"no-op job, 2 local ranks, added over by hand ({args.jobs} rounds)"
        lines.append(_line(figure, show("by hand", t["hand"], "ms"), cells, "<= +0.06 s"))
        cells = [show("", _less(t[f"{n} cpu"], t["hand cpu"]), "+s") for n in names]
        lines.append(_line("the same, CPU of every process", show("by hand", t["hand cpu"], "ms"), cells, ""))
    if args.slurm:
        t = slurm_row(args.slurm, baseline)
        cells = [show("", [a / b for a, b in zip(t[n], t["srun"], strict=True)], "x") for n in names]
        figure = f"6 no-op ranks, 3 Slurm nodes: distrun / one srun step ({args.slurm} rounds)"
        lines.append(_line(figure, show("srun", t["srun"], "ms"), cells, "<= 1.3x"))
    print("\n".join(lines))


def _less(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    return [a - b for a, b in zip(values, reference, strict=True)]


def _line(figure: str, reference: str, cells: Sequence[str], goal: str) -> str:
    return "| " + " | ".join([figure, reference.strip(), *(c.strip() for c in cells), goal]) + " |"


if __name__ == "__main__":
    main()
