"""A rank idle in its own code beside a helper thread, as a training script between steps: READY_DIR.

Writes READY_DIR/<RANK>.pid once idle, then sleeps until killed (the benchmark stops the job)."""

import os
import sys
import threading
import time


def helper() -> None:
    while True:
        time.sleep(0.5)


def idle() -> None:
    while True:
        time.sleep(1)


threading.Thread(target=helper, name="loader", daemon=True).start()
with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.pid"), "w") as f:
    f.write(str(os.getpid()))
idle()
