"""Rank 0 fills the console pipe, then every rank idles a while and exits 0."""

import os
import sys
import time

if os.environ["RANK"] == "0":
    sys.stdout.write("line of output\n" * 20000)  # more than a pipe holds
    sys.stdout.flush()
time.sleep(float(sys.argv[1]))
print("finished", flush=True)
