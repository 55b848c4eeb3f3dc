"""What importing distrun's packages pulls in, seen in a fresh interpreter: the CLI starts without torch,
paramiko or yaml, and `collectives` without torch until a name that needs it is used."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO


def test_import_is_light() -> None:
    code = "import sys, launcher.cli.main; print(sorted({'torch', 'paramiko', 'yaml'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stderr


def test_import_does_not_pull_in_torch() -> None:
    code = (
        "import sys, collectives; "
        "collectives.Average; collectives.CollectivesError; collectives.rank; collectives.scale_lr; "
        "collectives.ShardSampler; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_importing_the_launcher_does_not_import_paramiko() -> None:
    code = "import sys, launcher.core.config, launcher.core.hosts; assert 'paramiko' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
