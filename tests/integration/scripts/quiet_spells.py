"""Output with silent spells between: `quiet_spells.py SPELLS SECONDS` writes a line, then is quiet SECONDS,
SPELLS times; with `--bar` it draws a progress bar all along instead, never quiet for long. Everything goes to
stderr, where distrun writes its own words, so a test sees both in order."""

import sys
import time

spells, seconds = int(sys.argv[1]), float(sys.argv[2])
if "--bar" in sys.argv:
    steps = int(spells * seconds / 0.1)
    for i in range(steps):
        sys.stderr.write(f"\r{i}/{steps} [00:00<00:00, 10.00it/s]")
        sys.stderr.flush()
        time.sleep(0.1)
    sys.stderr.write("\n")
else:
    for spell in range(spells):
        print(f"spell {spell}", file=sys.stderr, flush=True)
        time.sleep(seconds)
print("done", file=sys.stderr, flush=True)
