from __future__ import annotations

import json
import time
from collections.abc import Mapping

import pytest

from collectives.placement import OWN_GPUS_VAR
from launcher.core.devices import RankDevices
from launcher.core.env import is_secret, parse_exports, parse_rank_filter, redact, worker_env
from launcher.core.hosts import Host
from launcher.core.plan import make_plan
from launcher.core.rendezvous import Rendezvous
from launcher.errors import UsageError

# Two nodes: a has ranks 0-2, b (IPv6) has rank 3.
PLAN = make_plan([Host("a", 3), Host("fd00::2", 2)], 4)
RDZV = Rendezvous(
    master_addr="10.0.0.1",
    master_port=29500,
    node_addrs=("10.0.0.1", "fd00::2"),
    tf_ports=((4001, 4002, 4003), (5001,)),
)


def env_for(
    rank: int,
    *,
    user_env: Mapping[str, str] | None = None,
    exports: Mapping[str, str] | None = None,
    ifname: str | None = "eth0",
    devices: RankDevices | None = None,
) -> dict[str, str]:
    return worker_env(
        PLAN.slots[rank],
        PLAN,
        RDZV,
        run_id="job1",
        user_env=user_env or {},
        exports=exports or {},
        ifname=ifname,
        restart_count=2,
        max_restarts=3,
        devices=devices,
    )


def test_full_contract_for_rank_on_second_node() -> None:
    env = env_for(3)
    tf = json.loads(env.pop("TF_CONFIG"))
    assert env == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default",
        "LOCAL_SIZE": "1",
        "CROSS_RANK": "1",
        "CROSS_SIZE": "2",
        "TORCHELASTIC_RUN_ID": "job1",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "DISTRUN_RUN_ID": "job1",
        "DISTRUN_HOSTNAME": "fd00::2",
        "DISTRUN_RESTART_COUNT": "2",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "PYTHONUNBUFFERED": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert tf == {
        "cluster": {"worker": ["10.0.0.1:4001", "10.0.0.1:4002", "10.0.0.1:4003", "[fd00::2]:5001"]},
        "task": {"type": "worker", "index": 3},
    }


def test_shared_host_gets_local_sizes_and_one_omp_thread() -> None:
    env = env_for(1)
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["LOCAL_SIZE"], env["NODE_RANK"]) == (
        "1",
        "3",
        "3",
        "0",
    )
    assert env["OMP_NUM_THREADS"] == "1"
    assert json.loads(env["TF_CONFIG"])["task"]["index"] == 1
    assert "OMP_NUM_THREADS" not in env_for(3)


def test_user_settings_are_kept() -> None:
    user = {"OMP_NUM_THREADS": "8", "NCCL_SOCKET_IFNAME": "ib0", "PYTHONUNBUFFERED": "0"}
    env = env_for(0, user_env=user)
    assert "OMP_NUM_THREADS" not in env
    assert "NCCL_SOCKET_IFNAME" not in env
    assert "PYTHONUNBUFFERED" not in env
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_no_interface_sets_no_ifname() -> None:
    env = env_for(0, ifname=None)
    assert "GLOO_SOCKET_IFNAME" not in env
    assert "NCCL_SOCKET_IFNAME" not in env


def test_exports_win_over_defaults_but_never_over_identity() -> None:
    exports = {
        "OMP_NUM_THREADS": "4",
        "GLOO_SOCKET_IFNAME": "lo",
        "FOO": "bar",
        "RANK": "99",
        "DISTRUN_RUN_ID": "x",
    }
    env = env_for(1, exports=exports)
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["FOO"] == "bar"
    assert env["RANK"] == "1"
    assert env["DISTRUN_RUN_ID"] == "job1"


def test_stale_identity_in_user_env_is_overridden() -> None:
    env = env_for(2, user_env={"RANK": "7", "WORLD_SIZE": "99", "MASTER_PORT": "1"})
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("2", "4", "29500")


def test_a_ranks_own_gpus_replace_the_hosts_and_the_exported_devices() -> None:
    env = env_for(1, user_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, devices=RankDevices(1, ("GPU-77e1", "3")))
    assert (env["CUDA_VISIBLE_DEVICES"], env[OWN_GPUS_VAR]) == ("GPU-77e1,3", "2")
    exported = env_for(1, exports={"CUDA_VISIBLE_DEVICES": "4,5"}, devices=RankDevices(1, ("5",)))
    assert exported["CUDA_VISIBLE_DEVICES"] == "5"
    # Without --gpus-per-rank nothing about devices is set, and -x passes through untouched.
    assert "CUDA_VISIBLE_DEVICES" not in env_for(1) and OWN_GPUS_VAR not in env_for(1)
    assert env_for(1, exports={"CUDA_VISIBLE_DEVICES": "4"})["CUDA_VISIBLE_DEVICES"] == "4"


def test_bound_cores_set_one_omp_thread_per_core_unless_the_user_chose() -> None:
    bound = RankDevices(1, None, (4, 5, 6))
    assert env_for(1, devices=bound)["OMP_NUM_THREADS"] == "3"
    assert env_for(3, devices=RankDevices(3, None, (0, 1)))["OMP_NUM_THREADS"] == "2"  # alone on its host
    assert "OMP_NUM_THREADS" not in env_for(1, user_env={"OMP_NUM_THREADS": "8"}, devices=bound)
    assert env_for(1, exports={"OMP_NUM_THREADS": "8"}, devices=bound)["OMP_NUM_THREADS"] == "8"
    assert "CUDA_VISIBLE_DEVICES" not in env_for(1, devices=bound)


def test_tf_config_ports_must_be_distinct() -> None:
    rdzv = Rendezvous("10.0.0.1", 1, ("10.0.0.1", "fd00::2"), ((7, 7, 8), (9,)))
    with pytest.raises(ValueError, match="distinct"):
        worker_env(PLAN.slots[0], PLAN, rdzv, run_id="r", user_env={}, exports={}, ifname=None)


def test_rendezvous_must_cover_every_node() -> None:
    rdzv = Rendezvous("10.0.0.1", 1, ("10.0.0.1",), ((1, 2, 3),))
    with pytest.raises(ValueError, match="1 node addresses for 2 nodes"):
        worker_env(PLAN.slots[0], PLAN, rdzv, run_id="r", user_env={}, exports={}, ifname=None)


def test_parse_exports() -> None:
    environ = {"HOME": "/home/me", "EMPTY": ""}
    assert parse_exports(["A=1", "B=x=y", "C=", "HOME", "EMPTY"], environ) == (
        ("A", "1"),
        ("B", "x=y"),
        ("C", ""),
        ("HOME", "/home/me"),
        ("EMPTY", ""),
    )
    assert parse_exports([], environ) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("MISSING", "MISSING is not set here; give its value as -x MISSING=VALUE"),
        ("1A=2", "'1A' is not a valid environment variable name"),
        ("=3", "'' is not a valid environment variable name"),
        ("A-B=1", "not a valid environment variable name"),
        ("RANK=1", "distrun sets RANK for every rank"),
        ("LOCAL_RANK", "distrun sets LOCAL_RANK"),
        ("TF_CONFIG={}", "distrun sets TF_CONFIG"),
        ("TORCHELASTIC_RUN_ID=x", "distrun sets TORCHELASTIC_RUN_ID"),
        ("DISTRUN_RUN_ID=x", "distrun sets DISTRUN_RUN_ID"),
        ("MASTER_ADDR=h", "use --master-addr"),
        ("MASTER_PORT=1", "use --master-port"),
        ("A=\0", "NUL"),
    ],
)
def test_parse_exports_errors(value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_exports([value], {"LOCAL_RANK": "0"})
    assert info.value.exit_code == 2


def test_export_given_twice() -> None:
    with pytest.raises(UsageError, match="-x A is given twice"):
        parse_exports(["A=1", "A=2"], {})


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("AWS_SECRET_ACCESS_KEY", True),
        ("HF_TOKEN", True),
        ("db_password", True),
        ("api_key", True),
        ("WANDB_API_KEY", True),
        ("PATH", False),
        ("RANK", False),
        ("KEYBOARD", True),
        ("DB_PASSWD", True),
        ("GITHUB_PAT", True),
        ("GIT_CREDENTIALS", True),
        ("NPM_AUTH", True),
        ("BASIC_AUTH_USER", True),
        ("SMTP_PASS", True),
        ("DB_PWD", True),
        ("PWD", False),
        ("PYTHONPATH", False),
        ("GIT_AUTHOR_NAME", False),
        ("PASSES", False),
    ],
)
def test_is_secret(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


def test_redact_patterns_are_case_insensitive_globs() -> None:
    assert is_secret("MYCO_SIGNING", ["myco_*"])
    assert not is_secret("OTHER", ["myco_*"])


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("https://user:pw@host/repo.git", "https://user:<redacted>@host/repo.git"),
        ("postgres://app:s3cr3t@db:5432/x", "postgres://app:<redacted>@db:5432/x"),
        ("http://proxy:3128", "http://proxy:3128"),
        ("https://user@host/x", "https://user@host/x"),
        ("a=https://u:p@h1,https://v:q@h2", "a=https://u:<redacted>@h1,https://v:<redacted>@h2"),
        # A scheme that a run of digits or signs leads into: the run is kept as it is.
        ("x=1https://u:p@h", "x=1https://u:<redacted>@h"),
        ("+git+ssh://u:p@h", "+git+ssh://u:<redacted>@h"),
        ("9://u:p@h", "9://u:p@h"),
    ],
)
def test_passwords_in_urls_are_redacted(value: str, shown: str) -> None:
    assert redact({"ANY_URL": value}) == {"ANY_URL": shown}


@pytest.mark.parametrize("run", ["y", "aZ9+", "1a", "a://b:"])
def test_a_long_value_is_read_once_not_once_per_character(run: str) -> None:
    """A megabyte of one repeated run (a certificate or a blob in a variable) takes well under a second; read
    from every letter again, 128 KB took 27 s."""
    value = run * (1_000_000 // len(run))
    start = time.monotonic()
    assert redact({"BLOB": value + " https://u:p@h"}) == {"BLOB": value + " https://u:<redacted>@h"}
    assert time.monotonic() - start < 10


def test_redact() -> None:
    env = {"HF_TOKEN": "hf_abc", "LR": "0.1", "my_Password": "hunter2"}
    assert redact(env) == {"HF_TOKEN": "<redacted>", "LR": "0.1", "my_Password": "<redacted>"}
    assert env["HF_TOKEN"] == "hf_abc"


@pytest.mark.parametrize(
    ("spec", "ranks"),
    [("0", {0}), ("0,2-3", {0, 2, 3}), (" 1 , 1-2 ", {1, 2}), ("5-5", {5})],
)
def test_parse_rank_filter(spec: str, ranks: set[int]) -> None:
    assert parse_rank_filter(spec, 8) == frozenset(ranks)


def test_parse_rank_filter_without_world_size() -> None:
    assert parse_rank_filter("100-101") == frozenset({100, 101})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "'' is not a rank"),
        ("0,,1", "'' is not a rank"),
        ("a", "'a' is not a rank"),
        ("-1", "'-1' is not a rank"),
        ("1-", "'1-' is not a rank"),
        ("3-1", "the range '3-1' runs backwards"),
        ("0,4", "rank 4 does not exist \\(ranks are 0..3\\)"),
        ("2-9", "rank 9 does not exist"),
        # More digits than int() takes (4,300) ended distrun with a traceback.
        ("1" * 5000, "is not a rank or a range"),
        ("0-" + "1" * 19, "is not a rank or a range"),
        ("0-" + "1" * 18, "rank 1{18} does not exist"),
    ],
)
def test_parse_rank_filter_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_rank_filter(spec, 4)


def test_x_may_set_leftovers_distrun_does_not_own() -> None:
    """torchrun's TORCHELASTIC_USE_AGENT_STORE is not distrun's: dropped by default, settable on purpose."""
    assert parse_exports(["TORCHELASTIC_USE_AGENT_STORE=False", "DISTRUN_MY_FLAG=1"], {}) == (
        ("TORCHELASTIC_USE_AGENT_STORE", "False"),
        ("DISTRUN_MY_FLAG", "1"),
    )
    with pytest.raises(UsageError, match="distrun sets TORCHELASTIC_RESTART_COUNT"):
        parse_exports(["TORCHELASTIC_RESTART_COUNT=3"], {})


def test_the_launcher_and_the_worker_library_name_the_own_gpus_variable_alike() -> None:
    from launcher.core import env

    assert env.OWN_GPUS_VAR == OWN_GPUS_VAR
