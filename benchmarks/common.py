"""Shared by the benchmark scripts: run things side by side, several times, and take medians."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).parent / "workers"


def env_with_repo(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def distrun(*args: str | os.PathLike[str], tree: Path | None = None) -> list[str]:
    """The distrun command line; with `tree`, the distrun of that checkout (e.g. `git archive main`).

    Not `-m launcher` with PYTHONPATH=tree: `-m` puts the working directory first on sys.path, and run from
    this checkout that would import this tree's launcher whatever PYTHONPATH says.
    """
    if tree is None:
        return [sys.executable, "-m", "launcher", *map(str, args)]
    run = (
        f"import runpy,sys;sys.path.insert(0,{str(tree)!r});runpy.run_module('launcher',run_name='__main__')"
    )
    return [sys.executable, "-c", run, *map(str, args)]


def timed_run(argv: Sequence[str], env: dict[str, str] | None = None, **kwargs: object) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env or env_with_repo(), **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """Median seconds per case; cases alternate within each round so machine noise hits them alike."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, case in cases.items():
            samples[name].append(case())
    return {name: statistics.median(values) for name, values in samples.items()}
