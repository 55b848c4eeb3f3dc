"""Print as fast as possible: numbered lines, multibyte characters split across writes, \\r redraws."""

import os
import sys

rank = int(os.environ["RANK"])
lines = int(sys.argv[1])
out = sys.stdout.buffer
chunk = []
for i in range(lines):
    chunk.append(f"r{rank} line {i} ünïcödé ✓\n".encode())
    if len(chunk) == 1000:
        out.write(b"".join(chunk))
        chunk = []
out.write(b"".join(chunk))
# One multibyte character split across two writes with a flush between them.
snow = "☃".encode()
out.write(b"split " + snow[:1])
out.flush()
out.write(snow[1:] + b" end\n")
out.write(b"progress 10%\rprogress 50%\rprogress 100%\n")
out.write(b"bad utf8 \xff\xfe here\n")
out.write(b"final without newline")
out.flush()
