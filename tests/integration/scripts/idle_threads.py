"""Ranks with threads, idle in the user's own code until released (issue 38): DIR MODE [VICTIM KILL_AT].

Each rank writes DIR/<start rank>.pid once it is idle in `idle`, then exits 0 once DIR/release exists. MODE:
- threads: two helper threads of different stacks (one sleeps, one polls), no torch (`garbled`: see garble).
- elastic: an hvd.elastic loop of 4 batches (its engine's and elastic channel's threads), idle after batch
  2; the rank starting as VICTIM kills itself with SIGKILL at batch KILL_AT (before it idles), so that the
  others idle after a reset in place.
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

out, mode = Path(sys.argv[1]), sys.argv[2]
victim, kill_at = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (-1, -1)


def idle(rank: int) -> None:
    """Wait in one place, whenever the stacks are read: a thread looks for DIR/release (the main thread,
    looking itself, was now and then read mid-look, in pathlib, under load)."""
    released = threading.Event()
    threading.Thread(target=watch_release, args=(released,), daemon=True).start()
    (out / f"{rank}.pid").write_text(str(os.getpid()))
    released.wait()


def watch_release(released: threading.Event) -> None:
    while not (out / "release").exists():
        time.sleep(0.05)
    released.set()


def helper_sleeps() -> None:
    time.sleep(3600)


def helper_polls() -> None:
    while True:
        time.sleep(0.05)


def garble() -> None:
    """Answer the agent's stack signal with garbage in place of faulthandler's dump and the hook's whole one
    (marked cut, so that the agent waits for the whole one, which is garbled too)."""
    where, signum = os.environ["DISTRUN_STACK_DIR"], int(os.environ["DISTRUN_STACK_SIGNAL"])

    def write(*_: object) -> None:
        noise = 'Thread 0x\n  File "x.py", line ? in \n  File "\n\x00\xff garbage\n  ...\n'
        with open(os.path.join(where, f"{os.getpid()}.stack"), "a") as f:
            f.write("Current thread 0x00007f (most recent call first):\n" + noise)
        with open(os.path.join(where, f"{os.getpid()}.whole"), "w") as f:
            f.write("thread\t1\n12\tf\nthread\tx\ty\tz\nabc\tf\tg.py\n\t\t\n")

    signal.signal(signum, write)


if mode == "garbled":
    garble()
    mode = "threads"
if mode == "threads":
    threading.Thread(target=helper_sleeps, daemon=True).start()
    threading.Thread(target=helper_polls, daemon=True).start()
    idle(int(os.environ["RANK"]))
    sys.exit(0)

import torch  # noqa: E402

import collectives as hvd  # noqa: E402

hvd.init()
start_rank = hvd.rank()
model = torch.nn.Linear(4, 2)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)


@hvd.elastic.run
def train(state):
    while state.batch < 4:
        if state.batch == kill_at and start_rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        model(torch.ones(8, 4)).sum().backward()
        optimizer.step()
        state.batch += 1
        state.commit()
        if state.batch == 2:
            idle(start_rank)


train(hvd.elastic.TorchState(model, optimizer, batch=0))
