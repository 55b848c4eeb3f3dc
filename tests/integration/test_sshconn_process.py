"""launcher.backends.ssh.connect where a real process is needed: the open-files limit is a process's own, so
it
is raised in a fresh interpreter (the known_hosts cache is tested in-process: tests/unit/test_hostkeys.py).
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO


def test_open_files_limit_is_raised_for_many_hosts() -> None:
    code = (
        "import resource\n"
        "from launcher.backends.ssh.connect import ensure_open_files\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "ensure_open_files(3 * 500)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=REPO).stdout.split()  # fmt: skip
    soft, hard = int(out[0]), int(out[1])
    assert soft == (min(1500 + 256, hard) if hard >= 0 else 1500 + 256)
