"""A tqdm-style bar at a set pace: `paced.py STEPS SECONDS_PER_STEP [SLOW_RANK FACTOR]`; the slow rank's
steps take FACTOR times longer. The bar shows the rate it measured, as tqdm does."""

import os
import sys
import time

rank = int(os.environ["RANK"])
steps, pause = int(sys.argv[1]), float(sys.argv[2])
if len(sys.argv) > 4 and rank == int(sys.argv[3]):
    pause *= float(sys.argv[4])
start = time.monotonic()
for i in range(1, steps + 1):
    time.sleep(pause)
    rate = i / (time.monotonic() - start)
    sys.stderr.write(f"\r{100 * i // steps:3d}%| {i}/{steps} [00:01<00:02, {rate:.2f}it/s]")
    sys.stderr.flush()
sys.stderr.write("\n")
