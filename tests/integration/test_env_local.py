"""--no-forward-env on this machine: a local rank keeps only what a login here would give it, as a remote rank
keeps only its own login's; --dry-run says so (issue 19, defect 7)."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.core.env import is_owned
from launcher.core.forward import login_variable
from tests.support import SCRIPTS, clean_env, run_distrun

SECRET = "sk-only-in-this-shell"


def _env_of(out: Path, rank: int) -> dict[str, str]:
    env: dict[str, str] = json.loads((out / f"{rank}.json").read_text())["env"]
    return env


def test_no_forward_env_keeps_this_shell_from_local_ranks(tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text("FROM_FILE=file\n")
    shell = clean_env(API_TOKEN=SECRET, ONLY_SHELL="1", LC_ALL="C.UTF-8")
    args = ("-np", "2", "--env-file", env_file, "-x", "FROM_X=x", "-x", "ONLY_SHELL")

    result = run_distrun(*args, SCRIPTS / "envdump.py", tmp_path, env=shell, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert _env_of(tmp_path, 0)["API_TOKEN"] == SECRET, "forwarded by default"

    result = run_distrun(*args, "--no-forward-env", SCRIPTS / "envdump.py", tmp_path, env=shell, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    for rank in range(2):
        env = _env_of(tmp_path, rank)
        assert "API_TOKEN" not in env, "this shell's secret reached a local rank"
        assert (env["FROM_FILE"], env["FROM_X"], env["ONLY_SHELL"]) == ("file", "x", "1"), (
            "-x VAR still works"
        )
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2", "the contract still arrives"
        assert env["PATH"] == shell["PATH"] and env["LC_ALL"] == "C.UTF-8", "what a login here gives"
        # Every variable is a login variable of this machine, the contract, or the user's word.
        strays = [
            name for name in env
            if not (login_variable(name) or is_owned(name) or name in ("FROM_FILE", "FROM_X", "ONLY_SHELL"))
            and name not in ("PYTHONUNBUFFERED", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
            and name not in ("PYTHONPATH", "PYTHONWARNINGS")  # only the stack hook: checked below
            and not name.startswith(("DISTRUN_", "TORCHELASTIC_", "GLOO_", "NCCL_"))
        ]  # fmt: skip
        assert strays == [], f"inherited from this shell: {strays}"
        assert env["PYTHONPATH"] == env["DISTRUN_STACK_DIR"], "this shell's PYTHONPATH reached a local rank"


def test_dry_run_shows_what_local_ranks_keep(tmp_path: Path) -> None:
    shell = clean_env(API_TOKEN=SECRET)
    result = run_distrun("--dry-run", "-np", "2", "--no-forward-env", "true", env=shell, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode()
    assert SECRET not in out and "API_TOKEN" not in out
    kept = next(line for line in out.splitlines() if line.startswith("ranks on this machine keep only"))
    assert " PATH" in kept and "PYTHONPATH" not in kept.split(": ", 1)[1].split()
