"""A tqdm-style progress bar on stderr: `\\r`-redrawn, then a newline; a stdout line when done.

bar.py STEPS PAUSE
"""

import os
import sys
import time

rank = os.environ["RANK"]
steps, pause = int(sys.argv[1]), float(sys.argv[2])
for i in range(steps + 1):
    filled = 10 * i // steps
    sys.stderr.write(f"\r{100 * i // steps:3d}%|{'#' * filled}{' ' * (10 - filled)}| {i}/{steps}")
    sys.stderr.flush()
    if i < steps:
        time.sleep(pause)
sys.stderr.write("\n")
print(f"rank {rank} done", flush=True)
