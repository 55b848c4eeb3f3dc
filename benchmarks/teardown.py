"""Teardown: time from one rank's failure to distrun's exit while 7 other ranks are running.

python benchmarks/teardown.py [--ranks 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import WORKERS, distrun, env_with_repo


def once(ranks: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            distrun("-np", str(ranks), WORKERS / "fail_when_all_ready.py", tmp),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env_with_repo(),
        )
        code = proc.wait(timeout=120)
        exited_at = time.time()
        if code != 1:
            raise SystemExit(f"expected exit code 1 from the failing rank, got {code}")
        return exited_at - float((Path(tmp) / "failed_at").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    samples = [once(args.ranks) for _ in range(args.repeat)]
    median = statistics.median(samples)
    print(
        f"failure -> distrun exit with {args.ranks - 1} other ranks running: median {median:.3f}s,"
        f" max {max(samples):.3f}s over {args.repeat} runs (target < 0.5s)"
    )


if __name__ == "__main__":
    main()
