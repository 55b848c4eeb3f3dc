"""What importing distrun's packages pulls in, seen in a fresh interpreter: the CLI starts without torch,
paramiko or yaml, and `collectives` without torch until a name that needs it is used."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence

from tests.support import REPO, run_distrun


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


# Modules only some jobs need: an elastic job's, --workdir's, stack dumps', and the bodies of the frames those
# send (launcher.agent.protocol.ELSEWHERE). A plain job loading any of them pays for it on every start.
ELASTIC = (
    "launcher.job.elastic",
    "launcher.job.host_watch",
    "launcher.core.elastic_plan",
    "launcher.core.elastic_policy",
    "launcher.core.host_changes",
    "launcher.job.slot_wait",
    "launcher.agent.elastic_messages",
)
NOT_ON_THE_LAUNCH_PATH = (
    *ELASTIC,
    "launcher.agent.stack_messages",
    "launcher.agent.sample_messages",
    "launcher.agent.workdir_messages",
    "launcher.workdir.sync",
    "launcher.diagnose.stacks",
)
PRINT = "print(sorted(set(sys.argv[1].split(',')) & set(sys.modules)))\n"
# Runs a job in this process (`_run`: not distrun's os._exit), then prints its exit code and which of those
# modules it loaded.
JOB = (
    "import sys\n"
    "from launcher.cli.main import _run\n"
    "code = _run(sys.argv[2:])\n"
    "print(code, end=' ')\n" + PRINT
)


def loaded_by(code: str, *args: str, names: Sequence[str] = NOT_ON_THE_LAUNCH_PATH) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code, ",".join(names), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_the_launch_path_imports_no_module_of_a_feature_the_job_may_not_use() -> None:
    assert loaded_by("import sys, launcher.cli.main, launcher.job.launch\n" + PRINT) == "[]"


def test_a_plain_job_loads_none_of_them_and_an_elastic_one_its_own() -> None:
    assert loaded_by(JOB, "-np", "2", sys.executable, "-c", "pass") == "0 []"
    elastic = loaded_by(JOB, "-np", "1", "--min-np", "1", sys.executable, "-c", "pass")
    assert elastic.startswith("0 ["), elastic
    assert {"launcher.job.elastic", "launcher.core.elastic_policy"} <= set(ast.literal_eval(elastic[2:]))


def test_the_agent_s_start_imports_no_module_of_a_feature_the_job_may_not_use() -> None:
    names = (
        "launcher.agent.elastic",
        *(m for m in NOT_ON_THE_LAUNCH_PATH if m.startswith("launcher.agent.")),
    )
    assert loaded_by("import sys, launcher.agent.server\n" + PRINT, names=names) == "[]"


def test_the_ranks_hooks_load_no_heavy_module_at_the_ranks_start() -> None:
    """Every Python rank imports the stack and progress hooks at its start (PYTHONWARNINGS): they must not
    bring `enum` (with `signal`) or `json` (with `re`) into a rank that does not use them. Without `site`
    (-S) nothing else loads those here."""
    names = ("enum", "json", "re", "signal", "distrun_rankhook", "distrun_progresshook")
    code = f"import sys; print(sorted(set({names!r}) & sys.modules.keys()))"
    ran = run_distrun("--prefix", "none", "-np", "1", sys.executable, "-S", "-c", code)
    assert ran.returncode == 0, ran.stderr.decode()
    assert ran.stdout.decode().split() == ["['distrun_progresshook',", "'distrun_rankhook']"]
