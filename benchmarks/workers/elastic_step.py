"""A realistic elastic training start for benchmarks/elastic.py: torch, a model of ResNet-50's size (25.2M
parameters in three dense layers, cheap to run on CPU), a DataLoader over synthetic data, hvd.elastic.

`OUT KILL_AT`: start rank ELASTIC_VICTIM (default 2) SIGKILLs itself before step KILL_AT of the first
attempt, writing OUT/killed (the wall clock); with ELASTIC_FAILURE=cut it writes OUT/at instead and goes on,
for the benchmark to cut its host's link. Every rank writes OUT/step.<pid> (the wall clock) after its first
step in a new world: after a reset in place, or the first step of a restarted job. ELASTIC_PLAIN=1: the loop
runs without hvd.elastic.run, so the ranks never opt in and a failure restarts the whole job.
LOADER_WORKERS: the DataLoader's worker processes (default 1).
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import collectives as hvd

out, kill_at = Path(sys.argv[1]), int(sys.argv[2])
steps = 4 * kill_at
hvd.init()
start_rank = hvd.rank()
victim = int(os.environ.get("ELASTIC_VICTIM", "2"))
cut = os.environ.get("ELASTIC_FAILURE") == "cut"
restarted = os.environ.get("DISTRUN_RESTART_COUNT", "0") != "0"
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 1024),
)  # fmt: skip
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
data = TensorDataset(torch.randn(256, 1024), torch.randn(256, 1024))
loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=int(os.environ.get("LOADER_WORKERS", "1")))
new_world = [restarted]


def mark_reset() -> None:
    new_world[0] = True


def train(state):
    while state.step < steps:
        for inputs, targets in loader:
            if state.step >= steps:
                break
            if state.step == kill_at and start_rank == victim and not restarted:
                if cut:
                    (out / "at").write_text(repr(time.time()))
                elif not (out / "killed").exists():
                    (out / "killed").write_text(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            state.step += 1
            if new_world[0]:
                new_world[0] = False
                (out / f"step.{os.getpid()}").write_text(repr(time.time()))
            state.commit()


state = hvd.elastic.TorchState(model, optimizer, step=0)
state.register_reset_callbacks([mark_reset])
(train if os.environ.get("ELASTIC_PLAIN") == "1" else hvd.elastic.run(train))(state)
