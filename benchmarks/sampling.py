"""What sampling costs the agent: its CPU with --sample-interval on and off, side by side, at 64 ranks.

Two agents run at once on this machine, each with RANKS ranks (a shell that writes a line a second, and its
`sleep`: a tree of two processes, as a rank with a worker), one sampling every INTERVAL seconds and one not.
After a warm-up, each agent's own CPU time over WINDOW seconds is read from /proc, and printed as a percent
of one core, side by side. Both see the same machine at the same time, so load on it moves both alike.

    python benchmarks/sampling.py [--ranks 64] [--interval 2] [--window 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.agent.protocol import (  # noqa: E402 - the repository's, not an installed one's
    SAMPLES,
    START,
    FrameReader,
    RankSpec,
    StartRequest,
    encode_message,
)

RANK = ["sh", "-c", "while :; do echo step; sleep 1; done"]
_TICKS = os.sysconf("SC_CLK_TCK")


class Agent:
    """One agent process on pipes, its frames drained on a thread (SAMPLES counted)."""

    def __init__(self, ranks: int, interval: float) -> None:
        code = "from launcher.agent.server import main; main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO
        )
        self.samples = 0
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        specs = [RankSpec(rank, RANK, {"RANK": str(rank)}) for rank in range(ranks)]
        start = StartRequest(str(REPO), 2.0, specs, sample_interval=interval)
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode_message(START, start))
        self.proc.stdin.flush()

    def _drain(self) -> None:
        reader = FrameReader(after_magic=True)
        assert self.proc.stdout is not None
        while data := os.read(self.proc.stdout.fileno(), 1 << 16):
            self.samples += sum(frame.kind == SAMPLES for frame in reader.feed(data))

    def cpu_seconds(self) -> float:
        """The agent's own user + system time (not its ranks')."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # EOF: the agent stops its ranks and exits
        self.proc.wait(timeout=30)


def measure(ranks: int, interval: float, window: float, warmup: float) -> tuple[float, float, int]:
    """(CPU % of one core with sampling, without, SAMPLES frames seen in the window)."""
    sampling, quiet = Agent(ranks, interval), Agent(ranks, 0.0)
    try:
        time.sleep(warmup)
        began = time.monotonic()
        cpu = (sampling.cpu_seconds(), quiet.cpu_seconds())
        frames = sampling.samples
        time.sleep(window)
        took = time.monotonic() - began
        on = (sampling.cpu_seconds() - cpu[0]) / took * 100
        off = (quiet.cpu_seconds() - cpu[1]) / took * 100
        return on, off, sampling.samples - frames
    finally:
        sampling.close()
        quiet.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{args.ranks} ranks per agent, --sample-interval {args.interval:g} vs 0, {args.window:g} s windows"
    )
    print(f"{'round':>5}  {'sampling':>9}  {'off':>9}  {'extra':>9}  {'SAMPLES':>7}")
    extras = []
    for round_ in range(args.repeat):
        on, off, frames = measure(args.ranks, args.interval, args.window, args.warmup)
        extras.append(on - off)
        print(f"{round_:>5}  {on:>8.3f}%  {off:>8.3f}%  {on - off:>8.3f}%  {frames:>7}", flush=True)
    print(f"median extra CPU of sampling: {statistics.median(extras):.3f}% of one core")


if __name__ == "__main__":
    main()
