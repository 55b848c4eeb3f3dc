"""Spare hosts and the blacklist across SSH hosts of the simulated cluster: a restart refills the world from
the hosts beyond the slots in use, an elastic job starts without a host it cannot reach, and every host left
out is named with the reason and for how long."""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import SLOW_CABLE, assert_clean
from tests.support import REPO, SCRIPTS, attempt_world, run_distrun, start_distrun, wait_for_files

pytestmark = pytest.mark.multihost

RESTARTABLE = SCRIPTS / "restartable.py"
FOUR = "h1:1,h2:1,h3:1,h4:1"
# A silent host is declared lost after keepalive x 5: 2.5 s instead of the default 10 s.
FAST_LOSS = ("--ssh-keepalive", "0.5", "--restart-delay", "0")
WHERE_AM_I = (
    "import os; e = os.environ; print('rank', e['RANK'], 'of', e['WORLD_SIZE'], e['DISTRUN_HOSTNAME'])"
)


def _cut_h2_mid_run(lab: Cluster, out: Path, *args: str) -> tuple[int, str]:
    """-np 3 on four 1-slot hosts (h4 the spare); h2's link is cut while attempt 0 runs."""
    proc = start_distrun(
        "-H", FOUR, "-np", "3", *FAST_LOSS, *args, RESTARTABLE, "--out", out, "--wait-attempt", "0",
        env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    wait_for_files(out, "a0.r*.pid", 3)
    lab.link_down("h2")
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        lab.link_up("h2")
    return proc.returncode, err.decode()


@pytest.mark.parametrize("mode", [("--min-np", "3"), ("--max-restarts", "2")], ids=["min-np", "max-restarts"])
def test_a_cut_host_is_replaced_by_the_spare(
    make_cluster: Callable[..., Cluster], tmp_path: Path, mode: tuple[str, str]
) -> None:
    lab = make_cluster(4)
    code, err = _cut_h2_mid_run(lab, tmp_path, *mode)
    assert code == 0, err
    assert attempt_world(tmp_path, 0) == {0: ("h1", "3"), 1: ("h2", "3"), 2: ("h3", "3")}
    assert attempt_world(tmp_path, 1) == {0: ("h1", "3"), 1: ("h3", "3"), 2: ("h4", "3")}
    assert "distrun: leaving out host h2 for the rest of the job: lost (" in err
    assert "attempt 1 takes in h4" in err
    assert not list(tmp_path.glob("a2.*")), err  # one restart: h2 was not tried again
    assert_clean(lab)


def test_an_elastic_job_starts_without_a_host_it_cannot_reach(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(4)
    lab.link_down("h4")
    try:
        result = run_distrun(
            "-H", FOUR, "-np", "4", "--min-np", "2", "--ssh-connect-timeout", "2", RESTARTABLE,
            "--out", tmp_path, env=lab.env(PYTHONPATH=str(REPO)),
        )  # fmt: skip
    finally:
        lab.link_up("h4")
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert attempt_world(tmp_path, 0) == {0: ("h1", "3"), 1: ("h2", "3"), 2: ("h3", "3")}
    line = next(line for line in err.splitlines() if "leaving out host h4" in line)
    named = "distrun: leaving out host h4 for the rest of the job: unreachable at the start ("
    assert line.startswith(named), err
    assert_clean(lab)


def test_a_fixed_size_job_still_refuses_to_start_with_a_host_down(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(2)
    lab.link_down("h2")
    try:
        result = run_distrun(
            "-H", "h1:1,h2:1", "--ssh-connect-timeout", "2", RESTARTABLE, "--out", tmp_path,
            env=lab.env(PYTHONPATH=str(REPO)),
        )  # fmt: skip
    finally:
        lab.link_up("h2")
    assert result.returncode == 3 and "h2: unreachable" in result.stderr.decode()
    assert not list(tmp_path.glob("a0.*"))
    assert_clean(lab)


def _read_until(proc: Popen[bytes], wanted: str, timeout: float = 60) -> str:
    """stderr up to (at least) the first line that holds `wanted`, read from the pipe unbuffered: what is not
    read here is left for `communicate`."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    said = b""
    deadline = time.monotonic() + timeout
    while wanted.encode() not in said:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no {wanted!r} within {timeout:g}s in:\n{said.decode()}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"no {wanted!r} before distrun ended:\n{said.decode()}")
        said += chunk
    return said.decode()


def test_a_blacklisted_host_comes_back_after_its_cooldown(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Two hosts, --min-np 2: without h2 the job waits (--elastic-timeout) for its 3 s cooldown to end, then
    restarts on both."""
    lab = make_cluster(2)
    proc = start_distrun(
        "-H", "h1:1,h2:1", "--min-np", "2", "--blacklist-cooldown-range", "3", "3", *FAST_LOSS,
        RESTARTABLE, "--out", tmp_path, "--wait-attempt", "0", env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    wait_for_files(tmp_path, "a0.r*.pid", 2)
    lab.link_down("h2")
    try:
        said = _read_until(proc, "leaving out host h2")
    finally:
        lab.link_up("h2")
    _, rest = proc.communicate(timeout=120)
    err = said + rest.decode()
    assert proc.returncode == 0, err
    assert "distrun: leaving out host h2 for 3s (cooldown): lost (" in err
    below = "only 1 slot left without h2 (h1), fewer than --min-np 2"
    assert f"distrun: {below}: waiting up to 600s (--elastic-timeout)" in err
    assert attempt_world(tmp_path, 1) == {0: ("h1", "2"), 1: ("h2", "2")}
    assert_clean(lab)


def test_without_a_cooldown_the_job_gives_up_below_min_np_at_once(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(2)
    proc = start_distrun(
        "-H", "h1:1,h2:1", "--min-np", "2", *FAST_LOSS, RESTARTABLE, "--out", tmp_path, "--wait-attempt", "0",
        env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    wait_for_files(tmp_path, "a0.r*.pid", 2)
    lab.link_down("h2")
    try:
        _, err_bytes = proc.communicate(timeout=120)
    finally:
        lab.link_up("h2")
    err = err_bytes.decode()
    assert proc.returncode == 3, err
    assert "distrun: leaving out host h2 for the rest of the job: lost (" in err
    assert "distrun: error: only 1 slot left without h2 (h1), fewer than --min-np 2" in err
    assert "waiting" not in err and not list(tmp_path.glob("a1.*"))
    assert_clean(lab)


def test_a_reset_in_place_starts_the_newcomer_on_a_spare_host(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Four 1-slot hosts, -np 3, every rank on hvd.elastic: rank 2 (on h3) is SIGKILLed; h1 and h2 keep their
    processes and h4, a spare with no rank until then, takes a newcomer: the world is 3 again."""
    lab = make_cluster(4)
    done = run_distrun(
        "-H", FOUR, "-np", "3", "--min-np", "2", SCRIPTS / "elastic_train.py", tmp_path, "2", "5",
        env=lab.env(PYTHONPATH=str(REPO)), timeout=300,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "left: rank 2 (on h3); joined: h4; world size 3" in err
    # As Horovod's driver: the failed rank's host is left out at once, and the spare takes its place.
    assert "distrun: leaving out host h3 for the rest of the job: a rank failed there" in err
    started = {int(p.stem): int(p.read_text()) for p in tmp_path.glob("*.start")}  # pid -> start rank
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(3)]
    assert [(got["rank"], got["size"], got["batch"]) for got in results] == [(r, 3, 12) for r in range(3)]
    assert [started[got["pid"]] for got in results[:2]] == [0, 1], "the survivors kept their processes"
    assert results[2]["pid"] != int((tmp_path / "killed").read_text()), "rank 2 is a newcomer"
    assert results[0]["weights"] == results[1]["weights"] == results[2]["weights"]
    assert_clean(lab)


def test_an_idle_spare_that_is_lost_is_left_out_and_the_job_goes_on(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(4)
    proc = start_distrun(
        "-H", FOUR, "-np", "3", "--min-np", "2", "--ssh-keepalive", "0.5", SCRIPTS / "elastic_train.py",
        tmp_path, "-1", "0", "16", env=lab.env(PYTHONPATH=str(REPO), ELASTIC_SLOW_S="0.5"),
    )  # fmt: skip
    wait_for_files(tmp_path, "opted.*", 3)
    lab.link_down("h4")
    try:
        _, err_bytes = proc.communicate(timeout=120)
    finally:
        lab.link_up("h4")
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    assert "distrun: leaving out host h4 for the rest of the job: lost while a spare (no word from it" in err
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(3)]
    assert [(got["size"], got["batch"], got["sizes"]) for got in results] == [(3, 16, [])] * 3
    assert_clean(lab)


@pytest.mark.alone  # preflight measures the machine
def test_preflight_leaves_a_slow_host_out_and_a_measured_spare_takes_its_place(
    make_cluster: Callable[..., Cluster],
) -> None:
    lab = make_cluster(4)
    lab.shape_link("h2", SLOW_CABLE)
    result = run_distrun(
        "--preflight", "-H", FOUR, "-np", "3", "--min-np", "2", "python3", "-c",
        WHERE_AM_I, env=lab.env(), timeout=300,
    )  # fmt: skip
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, out + err
    assert "distrun: preflight: h2: link " in err
    assert "distrun: leaving out host h2 for the rest of the job: named by --preflight" in err
    ranks = sorted(line.split("] ", 1)[-1] for line in out.splitlines() if "rank" in line)
    assert ranks == ["rank 0 of 3 h1", "rank 1 of 3 h3", "rank 2 of 3 h4"]
    assert_clean(lab)


def test_an_elastic_job_below_min_np_at_the_start_waits_for_a_cooldown_and_tries_again(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(2)
    lab.link_down("h2")
    proc = start_distrun(
        "-H", "h1:1,h2:1", "--min-np", "2", "--blacklist-cooldown-range", "1", "1", "--ssh-connect-timeout",
        "2", RESTARTABLE, "--out", tmp_path, env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    try:
        said = _read_until(proc, "waiting up to 600s (--elastic-timeout) for a host's cooldown")
    finally:
        lab.link_up("h2")
    _, rest = proc.communicate(timeout=120)
    err = said + rest.decode()
    assert proc.returncode == 0, err
    assert "only 1 slot reachable (h1), fewer than --min-np 2; h2: unreachable" in said
    assert attempt_world(tmp_path, 0) == {0: ("h1", "2"), 1: ("h2", "2")}
    assert_clean(lab)


def test_a_spare_that_cannot_run_the_job_is_left_out_not_the_job(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(4)
    job = tmp_path / "job"
    job.mkdir()
    (job / "restartable.py").write_text(RESTARTABLE.read_text())
    out = tmp_path / "out"
    out.mkdir()
    lab.hide_path("h4", job)  # h4 lacks the script
    result = run_distrun(
        "-H", FOUR, "-np", "3", "--min-np", "2", job / "restartable.py", "--out", out,
        env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    line = next(line for line in err.splitlines() if "leaving out host h4" in line)
    assert line.startswith("distrun: leaving out host h4 for the rest of the job: unfit as a spare ("), line
    assert "not found" in line
    assert attempt_world(out, 0) == {0: ("h1", "3"), 1: ("h2", "3"), 2: ("h3", "3")}
    assert_clean(lab)
