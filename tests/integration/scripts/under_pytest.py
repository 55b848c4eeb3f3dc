"""A rank that is a test inside pytest: pytest and pluggy put ~30 frames above the test's own.

Copied to a project of its own as test_under_pytest.py and run there as `python -m pytest -q
test_under_pytest.py` with READY_DIR in the environment: the test writes READY_DIR/RANK.pid and sleeps.
"""

import os
import time


def test_waits_forever() -> None:
    with open(os.path.join(os.environ["READY_DIR"], f"{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
