"""Each rank writes its whole environment to DIR/RANK.json."""

import json
import os
import sys

with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.json"), "w") as f:
    json.dump(
        {"env": dict(os.environ), "argv": sys.argv[2:], "cwd": os.getcwd(), "executable": sys.executable}, f
    )
