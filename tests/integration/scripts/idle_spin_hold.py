"""No torch, quick to start: rank 0 idles, rank 1 spins a core, rank 2 holds 400 MiB (others idle).

idle_spin_hold.py READY_DIR [SECONDS]: each rank settles into its state for WARM seconds (so a sample taken
once it is ready sees it there), then writes READY_DIR/RANK.pid and keeps it up for SECONDS (default 600),
writing a line every second.
"""

import os
import sys
import time

WARM = 2.5
rank = int(os.environ["RANK"])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
held = bytearray(400 << 20) if rank == 2 else b""
for i in range(0, len(held), 4096):  # touched page by page: resident, not only reserved
    held[i] = 1
ready = time.monotonic() + WARM
end = ready + seconds
next_line = time.monotonic() + 1.0
told = False
while time.monotonic() < end:
    if rank == 1:
        while time.monotonic() < next_line:
            pass
    else:
        time.sleep(max(0.0, next_line - time.monotonic()))
    next_line += 1.0
    if not told and time.monotonic() >= ready:
        told = True
        with open(os.path.join(sys.argv[1], f"{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
    print(f"rank {rank} still here", flush=True)
