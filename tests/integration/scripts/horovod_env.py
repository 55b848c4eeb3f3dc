"""Each rank writes its HOROVOD_* variables and what collectives says of its place to DIR/RANK.json."""

import json
import os
import sys

import collectives as hvd

hvd.init()
got = {name: value for name, value in os.environ.items() if name.startswith("HOROVOD_")}
got["hvd"] = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]
with open(os.path.join(sys.argv[1], f"{hvd.rank()}.json"), "w") as f:
    json.dump(got, f)
hvd.shutdown()
