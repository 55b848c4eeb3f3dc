"""Log relay throughput: 8 ranks x 200k lines through distrun, against the same workers writing to /dev/null.

    python benchmarks/log_relay.py [--ranks 8] [--lines 200000] [--repeat 3]

distrun's console goes to a file, so every line is really prefixed, written and counted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import WORKERS, distrun, env_with_repo, interleaved


def through_distrun(ranks: int, lines: int, sink: Path) -> float:
    start = time.perf_counter()
    with open(sink, "wb") as out:
        subprocess.run(
            distrun("-np", str(ranks), WORKERS / "spam.py", str(lines)),
            stdout=out,
            check=True,
            env=env_with_repo(),
        )
    elapsed = time.perf_counter() - start
    got = sink.read_bytes().count(b"\n")
    if got != ranks * lines:
        raise SystemExit(f"lost lines: {got} of {ranks * lines}")
    return elapsed


def by_hand(ranks: int, lines: int) -> float:
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKERS / "spam.py"), str(lines)],
            stdout=subprocess.DEVNULL,
            env=env_with_repo(RANK=str(r)),
        )
        for r in range(ranks)
    ]
    for p in procs:
        p.wait()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sink = Path(tmp) / "console"
        t = interleaved(
            {
                "hand": lambda: by_hand(args.ranks, args.lines),
                "distrun": lambda: through_distrun(args.ranks, args.lines, sink),
            },
            args.repeat,
        )
        size_mb = sink.stat().st_size / 1e6
    total = args.ranks * args.lines
    print(f"{args.ranks} ranks x {args.lines} lines = {total} lines, {size_mb:.1f} MB prefixed")
    print(f"workers alone (to /dev/null): {t['hand']:.3f}s")
    print(f"through distrun (to a file):  {t['distrun']:.3f}s")
    print(
        f"distrun relay: {total / t['distrun'] / 1e6:.2f} M lines/s, {size_mb / t['distrun']:.0f} MB/s "
        f"({t['distrun'] / t['hand']:.2f}x the workers' own time)"
    )


if __name__ == "__main__":
    main()
