"""An elastic Horovod-style loop: DIR START_RANK_TO_KILL KILL_AT_BATCH [BATCHES].

Each rank writes DIR/<pid>.start when it starts, DIR/opted.<start rank> once it opted in, and
DIR/<start rank>.json when it finishes: its pid, its final rank and size, the batch it reached, the world
sizes its reset callbacks saw, and its weights. ELASTIC_SLOW_S slows each batch (seconds), so a test can act
mid-run; ELASTIC_TIMEOUT_S bounds a collective's wait for a peer whose link was cut. With ELASTIC_HOLD_RESET
set, a survivor writes DIR/<pid>.pid and DIR/held.<start rank> in its reset callback and stays there: a
reset that does not end, for tests that act during one. With ELASTIC_HOLD_BEFORE_COMMIT=<start rank>, that
rank writes DIR/<pid>.pid and DIR/paused.<start rank> at batch KILL_AT, before its collective, and stays
there: the reset that the victim's death begins waits for its last commit forever.
ELASTIC_DIE_IN_RESET=<start rank>: that rank SIGKILLs itself in its first reset callback (once the new world
formed its group, before its first sync): a loss while the new world forms.
ELASTIC_NEWCOMER_DIES set: a newcomer (started by a reset, not by the plan) SIGKILLs itself once it joined
its first world and every other rank's reset callbacks have run in it (each writes DIR/reset.<start
rank>.<size>), before it opts in: a newcomer lost while the new world forms, after its group formed (the
survivors meet the loss at the world's first sync; a loss inside the group's forming is
ELASTIC_NEWCOMER_DIES_EARLY's).
ELASTIC_NEWCOMER_DIES_EARLY set: the first newcomer SIGKILLs itself before it joins (hvd.init), so the
survivors' new group fails while it is created.
ELASTIC_TOP_LEVEL_BROADCAST set: the script broadcasts the model and optimizer at top level, as README's
example (a non-elastic script) does.
ELASTIC_RAISE_AT_END=<start rank>: that rank raises once it wrote its result (an uncaught exception after the
reset formed its group again).
ELASTIC_LATE_UPDATE=<start rank>: host updates reach that rank's state 2 seconds late, so that the others
consume theirs at commits where rank 0's view (which decides) has none yet.
With ELASTIC_FAIL_ALL_AT set to a batch, every rank
raises there (again after each reset), start rank r ELASTIC_FAIL_SPACING_S x r seconds after reaching it:
Horovod's all-ranks-failure scenario, its failures spaced apart.
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

import collectives as hvd

out, victim, kill_at = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
batches = int(sys.argv[4]) if len(sys.argv) > 4 else 12
if os.environ.get("ELASTIC_NEWCOMER_DIES_EARLY") and os.environ.get("DISTRUN_JOINED_AT_RESET"):
    try:  # the first newcomer only
        (out / "died_early").open("x").close()
    except FileExistsError:
        pass
    else:
        os.kill(os.getpid(), signal.SIGKILL)
hvd.init(timeout=float(os.environ.get("ELASTIC_TIMEOUT_S", "1800")))
if os.environ.get("ELASTIC_NEWCOMER_DIES") and (out / "killed").exists():  # started after the victim died
    # The survivors return from forming the group after this rank may: dying at once could cut their group
    # while it still forms (and their callbacks would never see this world).
    deadline = time.monotonic() + 120
    while len(list(out.glob(f"reset.*.{hvd.size()}"))) < hvd.size() - 1:
        if time.monotonic() > deadline:
            sys.exit("the other ranks' reset callbacks never ran in this world")
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
newcomer = bool(os.environ.get("DISTRUN_JOINED_AT_RESET"))
start_rank = int(os.environ["DISTRUN_START_RANK"]) if "DISTRUN_START_RANK" in os.environ else hvd.rank()
(out / f"{os.getpid()}.start").write_text(str(start_rank))
torch.manual_seed(start_rank)  # different weights everywhere: the sync must make them equal
model = torch.nn.Linear(4, 2)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
sizes = []
if os.environ.get("ELASTIC_TOP_LEVEL_BROADCAST"):
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def held() -> None:
    (out / f"{os.getpid()}.pid").write_text(str(os.getpid()))
    (out / f"held.{start_rank}").write_text("")
    while True:  # any handled signal ends one pause (the stacks distrun takes at --timeout, say)
        signal.pause()


def paused_before_commit() -> None:
    (out / f"{os.getpid()}.pid").write_text(str(os.getpid()))
    (out / f"paused.{start_rank}").write_text("")
    while True:  # as held(): a handled signal ends one pause only
        signal.pause()


@hvd.elastic.run
def train(state):
    (out / f"opted.{start_rank}").write_text("")  # its hello is sent: the agent knows it opted in
    while state.batch < batches:
        if state.batch == kill_at and start_rank == victim and not (out / "killed").exists():
            (out / "killed").write_text(str(os.getpid()))  # once: a newcomer may start as the same rank
            os.kill(os.getpid(), signal.SIGKILL)
        if state.batch == kill_at and os.environ.get("ELASTIC_HOLD_BEFORE_COMMIT") == str(start_rank):
            paused_before_commit()
        if state.batch == int(os.environ.get("ELASTIC_FAIL_ALL_AT", "-1")):
            time.sleep(start_rank * float(os.environ.get("ELASTIC_FAIL_SPACING_S", "0")))
            raise RuntimeError(f"start rank {start_rank} fails at batch {state.batch}")
        time.sleep(float(os.environ.get("ELASTIC_SLOW_S", "0")))
        optimizer.zero_grad()
        model(torch.ones(8, 4)).sum().backward()
        optimizer.step()
        state.batch += 1
        state.commit()
        if state.batch == kill_at and os.environ.get("ELASTIC_WAIT_FOR_HOSTS") and not sizes and not newcomer:
            # The first world holds until the host update reached this rank (unless an earlier commit saw
            # it, and a world after it may reach KILL_AT again); the commit raises. A newcomer's callbacks
            # have not run, so `sizes` alone would let it hold while the others go on. An earlier commit may
            # have consumed this rank's update while rank 0 had none yet: the hold waits for its arrival,
            # not for a message still queued.
            updated.wait()
            state.commit()


updated = threading.Event()


class _State(hvd.elastic.TorchState):
    def on_hosts_updated(self, timestamp: float, update: int) -> None:
        if os.environ.get("ELASTIC_LATE_UPDATE") == str(start_rank):
            time.sleep(2)
        super().on_hosts_updated(timestamp, update)
        updated.set()


state = _State(model, optimizer, batch=0)


def reset_seen() -> None:
    sizes.append(hvd.size())
    (out / f"reset.{start_rank}.{hvd.size()}").write_text("")


state.register_reset_callbacks([reset_seen])
if os.environ.get("ELASTIC_HOLD_RESET"):
    state.register_reset_callbacks([held])
if os.environ.get("ELASTIC_DIE_IN_RESET") == str(start_rank):
    state.register_reset_callbacks([lambda: os.kill(os.getpid(), signal.SIGKILL)])
train(state)
(out / f"{start_rank}.json").write_text(
    json.dumps(
        {
            "pid": os.getpid(),
            "rank": hvd.rank(),
            "size": hvd.size(),
            "horovod_size": os.environ["HOROVOD_SIZE"],
            "batch": state.batch,
            "sizes": sizes,
            "weights": model.weight.detach().flatten().tolist(),
        }
    )
)
if os.environ.get("ELASTIC_RAISE_AT_END") == str(start_rank):
    raise RuntimeError(f"raised at the end by start rank {start_rank}")
