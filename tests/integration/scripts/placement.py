"""Writes this rank's placement as JSON to DIR/rank{RANK}.json: allowed cores, OMP_NUM_THREADS, GPU env."""

import json
import os
import sys

record = {
    "cores": sorted(os.sched_getaffinity(0)),
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as out:
    json.dump(record, out)
