"""distrun across SSH hosts of the simulated cluster: real sshd, real namespaces, real gloo groups."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster
from tests.multihost.support import assert_clean, distrun_on
from tests.support import REPO, SCRIPTS, distrun_argv, job_answer, run_distrun, start_distrun, wait_until

pytestmark = pytest.mark.multihost


def test_rank_zero_local_and_the_rest_remote(cluster: Cluster) -> None:
    result = distrun_on(cluster, "-H", "localhost:1,h1:1,h2:1", "--prefix", "host", SCRIPTS / "allreduce.py")
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode()
    for rank, host in enumerate(["localhost", "h1", "h2"]):
        assert f"[{host}:{rank}] rank {rank} of 3 sum=6 host={host}" in out
    assert_clean(cluster)


def test_more_ranks_on_one_host_than_sshd_max_sessions(cluster: Cluster) -> None:
    result = distrun_on(cluster, "-H", "h1:12", "python3", "-c", "import os; print(os.environ['RANK'])")
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(result.stdout.decode().splitlines()) == sorted(f"[{r}] {r}" for r in range(12))


def test_python_option_picks_the_remote_interpreter(cluster: Cluster, tmp_path: Path) -> None:
    python = sys.executable  # exists on the simulated hosts too: they share this file system
    result = distrun_on(cluster, "-H", "h1:1,h2:1", "--python", python, SCRIPTS / "envdump.py", tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    for rank in range(2):
        assert json.loads((tmp_path / f"{rank}.json").read_text())["executable"] == python


def test_missing_remote_interpreter_exits_3_naming_the_host(cluster: Cluster) -> None:
    result = distrun_on(cluster, "-H", "h2:1", "--python", "/no/such/python3", "train.py")
    err = result.stderr.decode()
    assert result.returncode == 3, err
    assert err.count("\n") == 1 and "h2" in err and "/no/such/python3" in err
    assert_clean(cluster)


def test_arguments_and_exports_arrive_byte_for_byte(cluster: Cluster, tmp_path: Path) -> None:
    nasty = [
        "a b",
        "it's",
        'say "hi"',
        "$(touch /tmp/pwned)",
        "x; rm -rf /",
        "line1\nline2",
        "ünï ✓",
        "*",
        "",
    ]
    result = distrun_on(
        cluster, "-H", "h1:1,h2:1", "-x", "NASTY=$(id); `id` 'q' \"d\"\nnext ✓",
        SCRIPTS / "envdump.py", tmp_path, *nasty,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    for rank in range(2):
        dump = json.loads((tmp_path / f"{rank}.json").read_text())
        assert dump["argv"] == nasty
        assert dump["env"]["NASTY"] == "$(id); `id` 'q' \"d\"\nnext ✓"
    assert not Path("/tmp/pwned").exists()


def test_host_dropping_off_the_network_is_named_and_the_rest_stop(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(3)
    proc = start_distrun(
        "-H", "h1:1,h2:1,h3:1", "--ssh-keepalive", "1", SCRIPTS / "behave.py", "--pid-dir", tmp_path,
        env=lab.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    wait_until(lambda: len(list(tmp_path.glob("rank*.pid"))) == 3)
    lab.link_down("h2")
    cut = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - cut < 15
    assert proc.returncode == 3
    assert "lost host h2" in err.decode()
    for host in ("h1", "h3"):
        assert lab.processes(host) == [] or wait_until(lambda h=host: lab.processes(h) == [])
    # The cut-off host's agent notices the launcher's silence and stops its ranks by itself.
    # Listed while they exit: a process gone between the listing and its command line is gone, not an error.
    wait_until(lambda: not [c for c in lab.commands("h2") if "behave.py" in c], what="h2's ranks stopped")


@pytest.mark.parametrize("fault", ["unreachable", "wrong key", "changed host key", "missing cwd"])
def test_host_faults_exit_3_naming_the_host_and_start_nothing(
    fault: str, make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    lab = make_cluster(2)
    marker = tmp_path / "ran"
    touch = f"open({str(marker)!r}, 'a').close()"
    argv = distrun_argv("-H", "h1:1,h2:1", "--ssh-connect-timeout", "3", "python3", "-c", touch)
    if fault == "unreachable":
        lab.stop_sshd("h2")
    elif fault == "wrong key":
        key = lab.home / ".ssh" / "id_ed25519"
        key.unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    elif fault == "changed host key":
        lab.rotate_host_key("h2")
    elif fault == "missing cwd":
        # The hosts share this machine's file system, so the launcher gets a private tmpfs: its working
        # directory exists here and nowhere else, as on a cluster without a shared home.
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        script = f'mount -t tmpfs distrun-test {mnt} && mkdir {mnt}/job && cd {mnt}/job && exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]
    result = subprocess.run(
        argv, capture_output=True, env=lab.env(PYTHONPATH=str(REPO)), cwd=REPO, timeout=60
    )
    err = result.stderr.decode()
    assert result.returncode == 3, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # A broken h2 is named; a fault of every host (our key, our cwd) names the first one.
    assert ("h1" if fault in ("wrong key", "missing cwd") else "h2") in err
    if fault == "changed host key":
        assert "ssh-keygen -R" in err
    assert not marker.exists()
    assert_clean(lab)


def test_ctrl_c_while_connecting_exits_at_once(make_cluster: Callable[..., Cluster]) -> None:
    lab = make_cluster(2)
    lab.link_down("h2")  # the handshake with h2 hangs until its 30 s connect timeout
    env = lab.env(PYTHONPATH=str(REPO))
    proc = start_distrun("-H", "h1:1,h2:1", "--ssh-connect-timeout", "30", "sleep", "60", env=env)

    def connecting() -> bool:
        said = job_answer(proc.pid, env)
        return said is not None and "it is starting: connecting to its hosts" in said.stderr

    wait_until(connecting, 60, "distrun stacks to say the job is connecting to its hosts")
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert time.monotonic() - sent < 3.0
    assert "Traceback" not in err.decode()
    assert_clean(lab)


def test_one_host_under_a_name_and_an_address_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """`-H h1:1,<h1's address>:1` would run two LOCAL_RANK 0 on one machine (issue 19, defect 11)."""
    marker = tmp_path / "ran"
    result = run_distrun(
        "-H", f"h1:1,{cluster.addr('h1')}:1", "touch", marker, env=cluster.env(PYTHONPATH=str(REPO))
    )
    assert result.returncode == 2, result.stderr.decode()
    assert result.stderr.decode() == (
        f"distrun: error: -H 'h1:1' and -H '{cluster.addr('h1')}:1' are the same machine (their agents "
        "report one machine-id, boot and hostname); list it once with all its slots (e.g. h1:2)\n"
    )
    assert not marker.exists()
    assert cluster.wait_clean(timeout=10.0) == {}
