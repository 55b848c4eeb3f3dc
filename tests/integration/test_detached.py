"""Every process a rank started, however it detached, is stopped with the job (issue 19, defect 5).

Each rank starts a child in a new session, one in a new process group, a double-forked setsid daemon and one
that also ignores SIGTERM. However the job ends (the ranks exit 0, one fails, distrun is told to stop),
none of them is left once distrun has exited: on SSH hosts too, the cases taking `where` (tests/multihost).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.multihost.support import Where
from tests.support import SCRIPTS, assert_all_gone, recorded_pids, run_distrun, start_distrun, wait_for_files

DETACH = SCRIPTS / "detach.py"
KINDS = 4


@pytest.mark.parametrize(
    ("where", "how", "args", "code"),
    [
        ("local", "succeed", (), 0),
        ("local", "fail", ("--code", "3"), 3),
        pytest.param("ssh", "succeed", (), 0, marks=pytest.mark.multihost),
    ],
    indirect=["where"],
)
def test_detached_descendants_end_with_the_job(
    tmp_path: Path, where: Where, how: str, args: tuple[str, ...], code: int
) -> None:
    # On SSH: a rank on this machine and one on each of two hosts of the simulated cluster.
    hosts, ranks = where.either((("-np", "2"), 2), (("-H", "localhost:1,h1:1,h2:1"), 3))
    result = run_distrun(*hosts, "--grace-period", "1", DETACH, tmp_path, *args, env=where.env())
    assert result.returncode == code, result.stderr.decode()
    pids = recorded_pids(tmp_path)
    assert len(pids) == ranks * KINDS, sorted(p.name for p in tmp_path.iterdir())
    assert_all_gone(pids, within=2.0)
    where.assert_clean(within=5.0)


def test_detached_descendants_end_when_distrun_is_stopped(tmp_path: Path) -> None:
    proc = start_distrun("-np", "2", "--grace-period", "1", DETACH, tmp_path, "--wait")
    wait_for_files(tmp_path, "*.ready", 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()
    assert_all_gone(recorded_pids(tmp_path), within=2.0)
