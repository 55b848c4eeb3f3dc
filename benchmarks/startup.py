"""Start-up cost: `distrun -np 2` against the same two workers started by hand, and against torchrun.

python benchmarks/startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import compileall
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, WORKERS, distrun, env_with_repo, interleaved, timed_run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def by_hand(script: Path, n: int = 2) -> float:
    """The floor: the workers themselves, env set by us, no launcher at all."""
    port = str(free_port())
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            # Each in a session of its own, as distrun starts ranks (and as two terminals would): with the
            # kernel's autogroup scheduling a session is one share of a loaded machine's CPU, so workers
            # sharing ours would run slower than distrun's for that reason alone.
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            # What distrun sets that matters for speed: without the interface, gloo resolves the hostname.
            env=env_with_repo(
                RANK=str(r),
                WORLD_SIZE=str(n),
                LOCAL_RANK=str(r),
                LOCAL_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                GLOO_SOCKET_IFNAME="lo",
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
            ),
        )
        for r in range(n)
    ]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"hand-started worker failed: {script}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    # An installed distrun has its bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 (this sandbox sets
    # it) would recompile the launcher on every start and measure that instead.
    compileall.compile_dir(REPO / "launcher", quiet=1)
    torchrun = shutil.which("torchrun")
    print(
        f"{'script':<14}{'by hand':>10}{'distrun':>10}{'torchrun':>10}{'distrun +s':>12}"
        f"{'distrun x':>11}{'torchrun x':>12}"
    )
    for script in (WORKERS / "noop.py", WORKERS / "gloo_barrier.py"):
        cases = {
            "hand": lambda s=script: by_hand(s),
            # Both launchers' own stderr (distrun's end-of-run account) is written, just not shown.
            "distrun": lambda s=script: timed_run(distrun("-np", "2", s), stderr=subprocess.DEVNULL),
        }
        if torchrun:
            cases["torchrun"] = lambda s=script: timed_run(
                [torchrun, "--standalone", "--nproc-per-node", "2", str(s)], stderr=subprocess.DEVNULL
            )
        t = interleaved(cases, args.repeat)
        tr = t.get("torchrun", float("nan"))
        print(
            f"{script.name:<14}{t['hand']:>9.3f}s{t['distrun']:>9.3f}s{tr:>9.3f}s"
            f"{t['distrun'] - t['hand']:>11.3f}s{t['distrun'] / t['hand']:>10.2f}x{tr / t['hand']:>11.2f}x"
        )


if __name__ == "__main__":
    main()
