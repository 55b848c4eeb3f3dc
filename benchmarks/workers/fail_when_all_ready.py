"""Every rank says it is running; once all are, rank 0 notes the time and fails."""

import os
import sys
import time

directory, world = sys.argv[1], int(os.environ["WORLD_SIZE"])
rank = int(os.environ["RANK"])
open(os.path.join(directory, f"ready.{rank}"), "w").close()
if rank != 0:
    time.sleep(120)
while len([n for n in os.listdir(directory) if n.startswith("ready.")]) < world:
    time.sleep(0.005)
time.sleep(0.2)  # let the others settle into their sleep
with open(os.path.join(directory, "failed_at"), "w") as f:
    f.write(repr(time.time()))
sys.exit(1)
