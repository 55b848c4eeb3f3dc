"""The elastic driver across SSH hosts of the simulated cluster: a rank on one host is SIGKILLed; the ranks on
the other hosts keep running (same processes, same state) in a smaller world, reset through their agents."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean
from tests.support import REPO, SCRIPTS, run_distrun

pytestmark = pytest.mark.multihost

SCRIPT = SCRIPTS / "elastic_train.py"


def test_a_killed_remote_ranks_peers_on_other_hosts_go_on_in_their_processes(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    done = run_distrun(
        "-H", "h1:1,h2:1,h3:1", "--min-np", "2", SCRIPT, tmp_path, "2", "5",
        env=lab.env(PYTHONPATH=str(REPO)), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    pids = {int(p.read_text()): int(p.stem) for p in tmp_path.glob("*.start")}
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [(got["rank"], got["size"], got["batch"]) for got in results] == [(0, 2, 12), (1, 2, 12)]
    assert [got["pid"] for got in results] == [pids[0], pids[1]], "the survivors kept their processes"
    assert results[0]["weights"] == results[1]["weights"]
    assert "reset 1: rank 2 (host h3) was killed by SIGKILL" in err
    assert "left: rank 2 (on h3); joined: none; world size 2" in err
    assert_clean(lab)


def test_a_failed_ranks_host_is_left_out_with_its_other_ranks_as_horovod_does(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Horovod's elastic driver blacklists a failed worker's host at once: its other rank leaves (exit 0), and
    the world goes on with the other hosts' ranks, in their processes."""
    lab = make_cluster(3)
    done = run_distrun(
        "-H", "h1:2,h2:2,h3:1", "--min-np", "2", SCRIPT, tmp_path, "1", "5",
        env=lab.env(PYTHONPATH=str(REPO)), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    pids = {int(p.read_text()): int(p.stem) for p in tmp_path.glob("*.start")}
    assert not (tmp_path / "0.json").exists(), "rank 0 left with its host"
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (2, 3, 4)]
    assert [(got["rank"], got["size"], got["batch"]) for got in results] == [(r, 3, 12) for r in range(3)]
    assert [got["pid"] for got in results] == [pids[r] for r in (2, 3, 4)], "the survivors kept their pids"
    assert "left: rank 1, rank 0 (on h1); joined: none; world size 3" in err
    assert "leaving out host h1 for the rest of the job: a rank failed there" in err
    assert_clean(lab)


def test_a_spare_whose_newcomer_left_a_world_that_never_formed_takes_the_next_one(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """A survivor dies while the new world forms: the newcomer on the spare host leaves with that world, and
    the spare's agent ends its attempt there (no rank left). The round's next decision starts a newcomer there
    again, as a new attempt on the same connection (the job once waited for it forever)."""
    lab = make_cluster(3)
    done = run_distrun(
        "-H", "h1:2,h2:1,h3:1", "-np", "3", "--min-np", "1", "--max-np", "3", SCRIPT, tmp_path, "2", "2", "5",
        env=lab.env(PYTHONPATH=str(REPO), ELASTIC_DIE_IN_RESET="1"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "attempt 1" not in err and "no reset in place" not in err, "no whole-job restart"
    pids = {int(p.read_text()): int(p.stem) for p in tmp_path.glob("*.start")}
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]
    assert sorted((got["rank"], got["size"], got["batch"]) for got in results) == [(0, 2, 5), (1, 2, 5)]
    [survivor] = [got for got in results if got["pid"] == pids[0]]
    assert survivor["sizes"] == [3, 2], "callbacks ran for the world that did not form, then this one"
    assert results[0]["weights"] == results[1]["weights"]
    [line] = [line for line in err.splitlines() if "reset 1:" in line]
    assert "joined: h3; world size 2" in line, line
    assert "reset 2:" not in err
    assert_clean(lab)


def test_a_group_that_failed_to_form_leaves_the_survivors_free_to_form_the_next_with_a_newcomer(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """The first newcomer (on spare h4) dies before it joins: the survivors' new group fails while it is
    created, and the next world takes a newcomer on spare h5, whose first group must meet the survivors'
    second (torch names groups by a count; the survivors' once stayed one up and the world never formed)."""
    lab = make_cluster(5)
    done = run_distrun(
        "-H", "h1:1,h2:1,h3:1,h4:1,h5:1", "-np", "3", "--min-np", "2", "--max-np", "3", SCRIPT, tmp_path, "2",
        "2", "5", env=lab.env(PYTHONPATH=str(REPO), ELASTIC_NEWCOMER_DIES_EARLY="1"), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert (tmp_path / "died_early").exists()
    assert "attempt 1" not in err and "no reset in place" not in err, "no whole-job restart"
    pids = {int(p.read_text()): int(p.stem) for p in tmp_path.glob("*.start")}
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]
    ended = sorted((got["rank"], got["size"], got["batch"]) for got in results)
    assert ended == [(rank, 3, 5) for rank in range(3)]
    assert [got["pid"] for got in results if got["rank"] < 2] == [pids[0], pids[1]], (
        "the survivors kept theirs"
    )
    assert len({json.dumps(got["weights"]) for got in results}) == 1
    [line] = [line for line in err.splitlines() if "reset 1:" in line]
    assert "joined: h5; world size 3" in line, line
    assert "reset 2:" not in err
    assert_clean(lab)
