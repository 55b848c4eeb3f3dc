"""The launcher's environment across hosts (issue 10): forwarded, deny-listed, overridden, never printed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import REPO, SCRIPTS, run_distrun

pytestmark = pytest.mark.multihost

SECRET = "hf_do_not_print_me"


def launch(cluster: Cluster, *args: str | os.PathLike[str], timeout: float = 120, **env: str):  # type: ignore[no-untyped-def]
    return run_distrun(*args, env=cluster.env(PYTHONPATH=str(REPO), **env), timeout=timeout)


def dumps(directory: Path, count: int) -> list[dict[str, str]]:
    return [json.loads((directory / f"{r}.json").read_text())["env"] for r in range(count)]


def test_launcher_environment_reaches_remote_ranks_less_the_deny_list(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = launch(
        cluster,
        "-H", "localhost:1,h1:1,h2:1", SCRIPTS / "envdump.py", tmp_path,
        FAIL_CODE="5", HF_TOKEN=SECRET, HOSTNAME="the-launcher", DISPLAY=":0", TMUX="/tmp/tmux-0/default,1,0",
        NCCL_SOCKET_IFNAME="lo", XDG_RUNTIME_DIR="/run/user/0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    envs = dumps(tmp_path, 3)
    for rank, env in enumerate(envs):
        assert env["FAIL_CODE"] == "5", f"rank {rank}"
        assert env["HF_TOKEN"] == SECRET
        assert env["PYTHONPATH"] == str(REPO)
    for env, host in zip(envs[1:], ("h1", "h2"), strict=True):
        # Deny-listed: the remote host's own login values, not the launcher's.
        assert env.get("HOSTNAME") != "the-launcher"
        assert "DISPLAY" not in env and "TMUX" not in env and "XDG_RUNTIME_DIR" not in env
        assert env["HOME"] == "/root", "HOME is the remote login's"
        assert "SSH_CONNECTION" in env, "the remote login's own SSH_* stay"
        assert env["NCCL_SOCKET_IFNAME"] == "eth0", f"{host}: its own interface, not the launcher's lo"
    assert SECRET.encode() not in result.stdout + result.stderr


def test_precedence_no_forward_env_file_and_x_across_hosts(cluster: Cluster, tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text("# job settings\nFROM_FILE=file\nBOTH=file\nFAIL_CODE=6\n")
    out = tmp_path / "out"
    out.mkdir()
    common = ("-H", "h1:1,h2:1", "--env-file", str(env_file), "-x", "BOTH=x")
    result = launch(cluster, *common, SCRIPTS / "envdump.py", out, FAIL_CODE="5", ONLY_SHELL="1")
    assert result.returncode == 0, result.stderr.decode()
    for env in dumps(out, 2):
        assert (env["FROM_FILE"], env["BOTH"], env["FAIL_CODE"], env["ONLY_SHELL"]) == ("file", "x", "6", "1")

    out2 = tmp_path / "out2"
    out2.mkdir()
    result = launch(cluster, *common, "--no-forward-env", SCRIPTS / "envdump.py", out2, ONLY_SHELL="1")
    assert result.returncode == 0, result.stderr.decode()
    for env in dumps(out2, 2):
        assert "ONLY_SHELL" not in env
        assert (env["FROM_FILE"], env["BOTH"]) == ("file", "x")
        assert env["RANK"] in ("0", "1"), "the contract still arrives"


def test_stale_torchelastic_agent_store_does_not_hang_gloo(cluster: Cluster) -> None:
    """torchrun leaves TORCHELASTIC_USE_AGENT_STORE=True in its workers; a distrun started there must work."""
    result = launch(
        cluster, "-H", "localhost:1,h1:1", "--timeout", "90", SCRIPTS / "allreduce.py",
        TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="outer", RANK="7",
        GLOO_SOCKET_IFNAME="nope0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(result.stdout.decode().splitlines())[0].endswith("rank 0 of 2 sum=3 host=localhost")


def test_secrets_never_in_dry_run_or_verbose_output(cluster: Cluster, tmp_path: Path) -> None:
    secrets = {"HF_TOKEN": SECRET, "DB_URL": "postgres://app:pw_not_shown@db/x", "MYCO_SIGNING": "myco_value"}
    for args in (("--dry-run",), ("-vv",)):
        result = launch(
            cluster, *args, "--redact", "MYCO_*", "-H", "h1:1", "python", "-c", "pass", timeout=120, **secrets
        )
        assert result.returncode == 0, result.stderr.decode()
        text = (result.stdout + result.stderr).decode()
        for value in ("hf_do_not_print_me", "pw_not_shown", "myco_value"):
            assert value not in text, (args, value)
    assert (
        "DB_URL='postgres://app:<redacted>@db/x'"
        in launch(cluster, "--dry-run", "-H", "h1:1", "x", **secrets).stdout.decode()
    )


def test_no_forward_env_is_the_same_for_local_and_remote_ranks(cluster: Cluster, tmp_path: Path) -> None:
    """One job, a rank here and one on h1: neither gets this shell's variables (issue 19, defect 7)."""
    out = tmp_path / "out"
    out.mkdir()
    result = launch(
        cluster, "-H", "localhost:1,h1:1", "--no-forward-env", "-x", "FROM_X=x", SCRIPTS / "envdump.py", out,
        ONLY_SHELL="1", API_TOKEN=SECRET,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    for env, where in zip(dumps(out, 2), ("local", "h1"), strict=True):
        assert "ONLY_SHELL" not in env and "API_TOKEN" not in env, f"{where}: this shell's variables arrived"
        assert env["FROM_X"] == "x" and "PATH" in env and "HOME" in env, where
