"""Log relay: throughput, memory and latency of distrun's console, each case side by side in one run.

    python benchmarks/log_relay.py [--ranks 8] [--lines 200000] [--mb 50] [--redraws 1000000] [--repeat 3]
                                   [--baseline DIR]

1. 8 ranks x 200k lines through distrun, against the same workers writing to /dev/null (with --baseline DIR,
   another checkout of distrun, e.g. `git archive main | tar -x -C DIR`, runs the same case alongside).
2. One rank writing 50 MB of 80-byte lines, against 50 MB with no newline at all.
3. One rank writing 1 M tqdm-style `\\r` redraws.
4. The latency from a rank's write to distrun's console write, for lines and for `\\r` redraws.

distrun's console goes to a file (to a pipe for the latency), so every byte is really prefixed and written;
its peak RSS is sampled with psutil every few milliseconds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from common import REPO, WORKERS, env_with_repo, interleaved

SHAPES = WORKERS / "shapes.py"


class PeakRss:
    """Samples a process's resident set size until it exits; `peak` in MB."""

    def __init__(self, pid: int) -> None:
        self.peak = 0.0
        self._proc = psutil.Process(pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            while self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE:
                self.peak = max(self.peak, self._proc.memory_info().rss / 1e6)
                time.sleep(0.005)
        except psutil.NoSuchProcess:
            pass

    def join(self) -> float:
        self._thread.join()
        return self.peak


def distrun_in(tree: Path, *args: str | Path, **popen: object) -> subprocess.Popen[bytes]:
    """distrun from checkout `tree` (its cwd too: `python -m` imports from the working directory first)."""
    env = env_with_repo(PYTHONPATH=str(tree))
    argv = [sys.executable, "-m", "launcher", *map(str, args)]
    return subprocess.Popen(argv, env=env, cwd=tree, **popen)  # type: ignore[call-overload,no-any-return]


def relay(tree: Path, sink: Path, *args: str | Path) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one distrun run whose stdout and stderr go to `sink`."""
    start = time.perf_counter()
    with open(sink, "wb") as out:
        proc = distrun_in(tree, *args, stdout=out, stderr=out)
        rss = PeakRss(proc.pid)
        if proc.wait() != 0:
            raise SystemExit(f"distrun failed: {args}")
    return time.perf_counter() - start, rss.join()


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


def latency(how: str, count: int = 100, pause: float = 0.02) -> list[float]:
    """Seconds from each write of a paced rank to the moment its text came out of distrun's stdout."""
    proc = distrun_in(
        REPO, "-np", "1", "--progress-interval", "0", SHAPES, "paced", str(count), str(pause), how,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    delays = []
    while chunk := proc.stdout.read1(65536):
        now = time.time()
        delays.extend(now - float(sent) for sent in re.findall(rb"sent (\d+\.\d+)", chunk))
    proc.wait()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--redraws", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another distrun checkout to run the lines case with")
    args = parser.parse_args()
    total = args.ranks * args.lines
    with tempfile.TemporaryDirectory() as tmp:
        sink = Path(tmp) / "console"
        rss: dict[str, float] = {}

        def case(
            name: str, tree: Path, *argv: str | Path, check: Callable[[bytes], bool]
        ) -> Callable[[], float]:
            def run() -> float:
                seconds, peak = relay(tree, sink, *argv)
                if not check(sink.read_bytes()):
                    raise SystemExit(f"{name}: the console output is not what was written")
                rss[name] = max(rss.get(name, 0.0), peak)
                return seconds

            return run

        def all_lines(data: bytes) -> bool:
            # Less distrun's own lines: the end-of-run account table comes after the ranks' output.
            return data.count(b"\n") - data.count(b"distrun: ") == total

        lines_case = ("-np", str(args.ranks), WORKERS / "spam.py", str(args.lines))
        cases = {
            "hand": lambda: by_hand(args.ranks, args.lines),
            "distrun": case("distrun", REPO, *lines_case, check=all_lines),
        }
        if args.baseline:
            cases["baseline"] = case("baseline", args.baseline.resolve(), *lines_case, check=all_lines)
        size = int(args.mb * 1e6) // 65520 * 65520  # what shapes.py writes: whole 64 KiB blocks
        cases["lines"] = case(
            "lines",
            REPO,
            "-np",
            "1",
            SHAPES,
            "lines",
            str(args.mb),
            check=lambda d: d.count(b"x") == size // 80 * 79,
        )
        cases["noline"] = case(
            "noline", REPO, "-np", "1", SHAPES, "noline", str(args.mb), check=lambda d: d.count(b"x") == size
        )
        cases["redraws"] = case(
            "redraws",
            REPO,
            "-np", "1", SHAPES, "redraws", str(args.redraws),
            check=lambda d: d.endswith(b"%7d/%d |####      |\n" % (args.redraws - 1, args.redraws)),
        )  # fmt: skip
        t = interleaved(cases, args.repeat)
    line_ms = [d * 1000 for d in latency("line")]
    redraw_ms = [d * 1000 for d in latency("redraw")]

    print(f"1. {args.ranks} ranks x {args.lines} lines = {total} prefixed lines (median of {args.repeat})")
    print(f"   workers alone (to /dev/null): {t['hand']:.3f}s")
    print(
        f"   through distrun:              {t['distrun']:.3f}s = {total / t['distrun'] / 1e6:.2f} M lines/s"
    )
    if args.baseline:
        print(
            f"   through {args.baseline}: {t['baseline']:.3f}s = {total / t['baseline'] / 1e6:.2f} M lines/s "
            f"(this tree: {t['baseline'] / t['distrun']:.2f}x its speed)"
        )
    mb = size / 1e6
    print(f"2. one rank, {mb:.0f} MB:")
    for name, what in (("lines", "80-byte lines"), ("noline", "no newline")):
        print(
            f"   {what + ':':15}{t[name]:.3f}s = {mb / t[name]:.0f} MB/s, distrun peak RSS {rss[name]:.0f} MB"
            + (f" ({t['lines'] / t['noline']:.2f}x the speed of lines)" if name == "noline" else "")
        )
    print(f"3. {args.redraws} \\r redraws: {t['redraws']:.3f}s, distrun peak RSS {rss['redraws']:.0f} MB")
    for name, ms in (("lines", line_ms), ("\\r redraws", redraw_ms)):
        print(
            f"4. write -> console latency, {len(ms)} {name} 20 ms apart: "
            f"median {statistics.median(ms):.1f} ms, "
            f"p95 {statistics.quantiles(ms, n=20)[-1]:.1f} ms, max {max(ms):.1f} ms"
        )


if __name__ == "__main__":
    main()
