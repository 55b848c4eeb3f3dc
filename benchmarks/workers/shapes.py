"""Output of a given shape, as fast as possible (or paced, for latency).

shapes.py lines MB | noline MB | redraws COUNT | paced COUNT SECONDS (line|redraw)
"""

import sys
import time

shape = sys.argv[1]
out = sys.stdout.buffer
if shape in ("lines", "noline"):
    size = int(float(sys.argv[2]) * 1e6)
    line = b"x" * 79 + b"\n" if shape == "lines" else b"x" * 80
    block = line * (65536 // len(line))
    for _ in range(size // len(block)):
        out.write(block)
elif shape == "redraws":
    count = int(sys.argv[2])
    err = sys.stderr.buffer
    for start in range(0, count, 1000):
        err.write(
            b"".join(b"\r%7d/%d |####      |" % (i, count) for i in range(start, min(count, start + 1000)))
        )
    err.write(b"\n")
    err.flush()
elif shape == "paced":
    count, pause, how = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    end = b"\n" if how == "line" else b""
    start = b"" if how == "line" else b"\r"
    for _ in range(count):
        out.write(start + b"sent %.6f" % time.time() + end)
        out.flush()
        time.sleep(pause)
    out.write(b"\n")
out.flush()
