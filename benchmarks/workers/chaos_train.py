"""The training script of benchmarks/chaos.py: hvd.elastic with a TorchState committed every epoch, a helper
thread of its own, a DataLoader with a worker process, as a Horovod elastic script is written.

`OUT`: each rank process writes OUT/pid.<pid> (its host) when it starts and OUT/trained.<pid> at each
commit; the job trains until OUT/stop exists (every rank agrees on it at an epoch's end, so all stop at
the same commit), then each rank of the last world writes OUT/final.<pid> with its rank, epoch and a digest
of its weights. CHAOS_STEP_S: a pause per step, so that events land inside epochs.
"""

import hashlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import collectives as hvd

out = Path(sys.argv[1])
step_s = float(os.environ.get("CHAOS_STEP_S", "0.05"))
(out / f"pid.{os.getpid()}").write_text(socket.gethostname())

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
data = TensorDataset(torch.randn(128, 32), torch.randn(128, 4))
loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=1)
beats = [0]


def helper() -> None:
    """A thread of the script's own, as logging or metrics threads are: stacks and resets must bear it."""
    while True:
        beats[0] += 1
        time.sleep(0.2)


threading.Thread(target=helper, name="metrics", daemon=True).start()


def train(state: hvd.elastic.TorchState) -> None:
    while True:
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            time.sleep(step_s)
        state.epoch += 1
        state.commit()
        (out / f"trained.{os.getpid()}").touch()
        asked = torch.tensor([1.0 if (out / "stop").exists() else 0.0])
        if hvd.allreduce(asked, op=hvd.Sum, name="chaos.stop").item() > 0:
            return


state = hvd.elastic.TorchState(model, optimizer, epoch=0)
hvd.elastic.run(train)(state)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
(out / f"final.{os.getpid()}").write_text(f"{hvd.rank()} {hvd.size()} {state.epoch} {digest}")
