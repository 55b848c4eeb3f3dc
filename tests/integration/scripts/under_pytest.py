"""A rank that is a test inside pytest: pytest and pluggy put ~30 frames above the test's own.

Run as `python -m pytest -q -p no:cacheprovider under_pytest.py` with READY_DIR in the environment: the test
writes READY_DIR/RANK.pid and sleeps.
"""

import os
import time


def test_waits_forever() -> None:
    with open(os.path.join(os.environ["READY_DIR"], f"{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
