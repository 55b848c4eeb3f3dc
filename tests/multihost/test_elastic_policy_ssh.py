"""The elastic policy across SSH hosts of the simulated cluster (docs/elastic.md, "The policy"):

- Horovod's all-ranks-failure scenario (2 hosts x 2 slots from a discovery script, every rank raising, the
  failures seconds apart) ends the job at the round's decision: no restart on the other host, no left-out
  host brought back by the script, no wait on --elastic-timeout;
- a host left out for the rest of the job never comes back, though the script lists it all along;
- a host left out with a cooldown comes back at the next commit after it, in a job that resets in place,
  with or without a script listing it;
- one host added to a job on two hosts joins (its software is compared, not taken for missing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean
from tests.support import REPO, SCRIPTS, run_distrun, start_distrun, wait_for_files

pytestmark = pytest.mark.multihost

SCRIPT = SCRIPTS / "elastic_train.py"


def _script(tmp_path: Path, lines: str, *, then: str | None = None) -> Path:
    """A discovery script printing `lines`, or `then` once the file `add` exists in its folder."""
    script = tmp_path / "discover.sh"
    listed = (
        f"printf '{lines}'"
        if then is None
        else f"if [ -e {tmp_path}/add ]; then printf '{then}'; else printf '{lines}'; fi"
    )
    script.write_text(f"#!/bin/sh\n{listed}\n")
    script.chmod(0o755)
    return script


def test_all_ranks_failing_seconds_apart_end_the_job_at_the_rounds_decision(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(2)
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, "h1:2\\nh2:2\\n")
    done = run_distrun(
        "-np", "4", "--min-np", "2", "--max-np", "4", "--host-discovery-script", script,
        "--max-restarts", "1", SCRIPT, out, "-1", "99", "5",
        env=lab.env(PYTHONPATH=str(REPO), ELASTIC_FAIL_ALL_AT="1", ELASTIC_FAIL_SPACING_S="2"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "no reset in place: every rank of the world failed (4 ranks)" in err
    assert "the job ends: every rank of the world failed" in err
    assert "reset 1:" not in err and "1 reset in place" not in err, "no reset: their own errors, no lost peer"
    assert "joined: h1" not in err and "attempt 1" not in err, "no restart, the left-out host not back"
    assert "--elastic-timeout" not in err
    assert_clean(lab)


def test_a_host_left_out_for_the_rest_of_the_job_never_comes_back(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, "h1:1\\nh2:1\\nh3:1\\n")
    done = run_distrun(
        "-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", script, SCRIPT, out,
        "2", "2", "12", env=lab.env(PYTHONPATH=str(REPO), ELASTIC_SLOW_S="0.4"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "leaving out host h3 for the rest of the job: a rank failed there" in err
    assert "hosts added: h3" not in err and "joined: h3" not in err
    results = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [(got["size"], got["batch"]) for got in results] == [(2, 12), (2, 12)]
    assert_clean(lab)


@pytest.mark.parametrize("with_script", [False, True], ids=["hosts", "discovery-script"])
def test_a_host_left_out_with_a_cooldown_comes_back_at_the_next_commit(
    make_cluster: Callable[..., Cluster], tmp_path: Path, with_script: bool
) -> None:
    lab = make_cluster(3)
    out = tmp_path / "out"
    out.mkdir()
    where = ["--host-discovery-script", str(_script(tmp_path, "h1:1\\nh2:1\\nh3:1\\n"))] if with_script else [
        "-H", "h1:1,h2:1,h3:1",
    ]  # fmt: skip
    done = run_distrun(
        "-np", "3", "--min-np", "2", "--max-np", "3", *where, "--blacklist-cooldown-range", "5", "5", SCRIPT,
        out, "2", "2", "60", env=lab.env(PYTHONPATH=str(REPO), ELASTIC_SLOW_S="0.4"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "leaving out host h3 for 5s (cooldown): a rank failed there" in err
    assert "reset 1: rank 2 (host h3) was killed by SIGKILL" in err
    source = "--host-discovery-script" if with_script else "a cooldown ended"
    assert f"reset 2: hosts added: h3 ({source}); left: none; joined: h3; world size 3" in err, err
    results = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1, 2)]  # 2: the newcomer
    assert [(got["rank"], got["size"], got["batch"]) for got in results] == [
        (0, 3, 60),
        (1, 3, 60),
        (2, 3, 60),
    ]
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"]
    assert_clean(lab)


def test_one_host_added_to_a_job_on_two_hosts_joins(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, "h1:1\\nh2:1\\n", then="h1:1\\nh2:1\\nh3:1\\n")
    proc = start_distrun(
        "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", script, "--reset-limit", "1",
        SCRIPT, out, "-1", "99", "30", env=lab.env(PYTHONPATH=str(REPO), ELASTIC_SLOW_S="0.3"),
    )  # fmt: skip
    wait_for_files(out, "opted.*", 2)
    (tmp_path / "add").touch()
    _, err_bytes = proc.communicate(timeout=300)
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    assert "mismatch" not in err and "cannot add" not in err
    assert "hosts added: h3 (--host-discovery-script); left: none; joined: h3; world size 3" in err
    results = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1, 2)]
    assert [(got["size"], got["batch"]) for got in results] == [(3, 30)] * 3
    assert_clean(lab)
