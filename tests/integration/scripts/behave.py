"""A worker whose behaviour the test chooses: record pids, spawn a grandchild, fail, hang, ignore SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--pid-dir", required=True)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--code", type=int, default=5)
parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself")
parser.add_argument("--exit-early-rank", type=int, default=-1, help="this rank exits 0 at once")
parser.add_argument("--after", type=float, default=0.5)
parser.add_argument("--sleep", type=float, default=60)
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument(
    "--fail-after-exit-of", type=int, default=-1, help="the failing rank waits for this one to end"
)
args = parser.parse_args()

rank = int(os.environ["RANK"])
if args.ignore_term:
    # A rank that will not stop when asked: neither Ctrl-C's SIGINT nor the SIGTERM after it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
# A grandchild in the rank's process group, like a DataLoader worker.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
with open(os.path.join(args.pid_dir, f"child{rank}.pid"), "w") as f:
    f.write(str(child.pid))
print(f"rank {rank} ready", flush=True)

if rank == args.exit_early_rank:
    print(f"rank {rank} leaving early", flush=True)
    sys.exit(0)
time.sleep(args.after)


def ended(other: int) -> bool:
    """Rank `other` has recorded its pid and exited (a zombie the agent has yet to reap counts as ended)."""
    try:
        with open(os.path.join(args.pid_dir, f"rank{other}.pid")) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return False  # not written yet
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


if rank == args.fail_rank:
    while args.fail_after_exit_of >= 0 and not ended(args.fail_after_exit_of):
        time.sleep(0.02)
    print(f"rank {rank} is failing on purpose", file=sys.stderr, flush=True)
    sys.exit(args.code)
if rank == args.kill_rank:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(args.sleep)
print(f"rank {rank} done", flush=True)
