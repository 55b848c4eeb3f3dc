"""Three lines and a partial one, then wait to be killed (for the --output-dir tests)."""

import sys
import time

for i in range(3):
    print(f"line {i}", flush=True)
sys.stdout.write("partial")
sys.stdout.flush()
time.sleep(600)
