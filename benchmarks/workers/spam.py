"""Print N numbered lines as fast as possible."""

import os
import sys

rank = os.environ.get("RANK", "0")
n = int(sys.argv[1])
out = sys.stdout.buffer
for start in range(0, n, 1000):
    block = range(start, min(n, start + 1000))
    out.write("".join(f"rank {rank} line {i} of the log relay benchmark\n" for i in block).encode())
out.flush()
