"""No torch, quick to start: rank 0 idles, rank 1 spins a core, rank 2 holds 400 MiB (others idle).

idle_spin_hold.py READY_DIR [SECONDS]: each rank writes READY_DIR/RANK.pid once it is in its state (the 400
MiB touched), then keeps it for SECONDS (default 600), writing a line every second.
"""

import os
import sys
import time

rank = int(os.environ["RANK"])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
held = bytearray(400 << 20) if rank == 2 else b""
for i in range(0, len(held), 4096):  # touched page by page: resident, not only reserved
    held[i] = 1
with open(os.path.join(sys.argv[1], f"{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
print(f"rank {rank} ready", flush=True)
end = time.monotonic() + seconds
next_line = time.monotonic() + 1.0
while time.monotonic() < end:
    if rank == 1:
        while time.monotonic() < next_line:
            pass
    else:
        time.sleep(max(0.0, next_line - time.monotonic()))
    next_line += 1.0
    print(f"rank {rank} still here", flush=True)
