"""A worker for restart tests: records its env per attempt, fails on a chosen attempt, or waits."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--fail", action="append", default=[], help="ATTEMPT:RANK:CODE, repeatable")
parser.add_argument("--wait-attempt", type=int, default=-1, help="on this attempt, sleep instead of exiting")
args = parser.parse_args()

attempt, rank = int(os.environ["DISTRUN_RESTART_COUNT"]), int(os.environ["RANK"])
# Whole or not at all: a rank stopped because another failed may die mid-write.
record = os.path.join(args.out, f"a{attempt}.r{rank}.json")
with open(record + ".part", "w") as f:
    json.dump({**dict(os.environ), "pid": os.getpid()}, f)
os.replace(record + ".part", record)
with open(os.path.join(args.out, f"a{attempt}.r{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
for spec in args.fail:
    when, who, code = (int(x) for x in spec.split(":"))
    if (when, who) == (attempt, rank):
        print(f"rank {rank} fails attempt {attempt}", file=sys.stderr, flush=True)
        sys.exit(code)
if attempt == args.wait_attempt:
    time.sleep(120)
