"""issue 27 item 16 on an SSH host: a command that cannot run is named as a shell names it, on the host as the
summary names it (here by its address, which is not the machine's own hostname)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.support import run_distrun

pytestmark = pytest.mark.multihost


def test_a_directory_as_the_command_on_a_remote_host(cluster: Cluster, tmp_path: Path) -> None:
    addr = cluster.addr("h2")
    done = run_distrun("-H", f"{addr}:1", "/tmp", env=cluster.env())
    err = done.stderr.decode()
    assert done.returncode == 126, err
    assert f"[0] distrun: cannot start rank 0 on {addr}: /tmp: is a directory\n" in err
    assert f"rank 0 (host {addr}) exited with code 126" in err
    assert "h2" not in err and "Permission denied" not in err
    assert cluster.wait_clean(timeout=10) == {}
