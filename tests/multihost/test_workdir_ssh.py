"""--workdir on the simulated cluster: hosts that cannot see the project at its path run it from their cache.

Each host gets a ~/.cache/distrun of its own (the hosts share this machine's filesystem otherwise) and sees an
empty directory where the project lies; the project is a git work tree with a .gitignored file.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.multihost.cluster import Cluster, cleanup_stale, unavailable_reason
from tests.support import REPO, never_left_running, run_distrun, start_distrun, wait_for_files, wait_until

pytestmark = pytest.mark.multihost

HOSTS = ("h1", "h2")
CACHE = Path("~root/.cache/distrun").expanduser()
TRAIN = """\
import hashlib, os, pathlib, mod
data = b"".join(p.read_bytes() for p in sorted(pathlib.Path("data").glob("*")))
print(f"rank={os.environ['RANK']} cwd={os.getcwd()} value={mod.VALUE} secret={os.path.exists('secret.txt')} "
      f"data={hashlib.sha256(data).hexdigest()[:16]}")
"""


@dataclass
class Setup:
    cluster: Cluster
    project: Path
    caches: dict[str, Path]  # each host's ~/.cache/distrun, as this machine sees it

    def launch(self, *args: str, report: Path | None = None) -> subprocess.CompletedProcess[bytes]:
        extra = ["--report", str(report)] if report is not None else []
        return run_distrun(
            "-H", ",".join(f"{h}:1" for h in HOSTS), "--workdir", self.project, "-v", *extra, *args,
            "train.py",
            env=self.cluster.env(PYTHONPATH=str(REPO)), timeout=180,
        )  # fmt: skip

    def objects(self, host: str) -> list[Path]:
        return [p for p in (self.caches[host] / "workdir" / "objects").glob("*/*")]


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "mod.py").write_text("VALUE = 1\n")
    (root / "secret.txt").write_text("never leaves this machine\n")
    (root / ".gitignore").write_text("secret.txt\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "train.py", "mod.py", ".gitignore"], check=True)
    return root


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cleanup_stale()
    project = _project(tmp_path_factory.mktemp("workdir") / "proj")
    with Cluster(len(HOSTS)) as cluster:
        caches = {}
        for host in HOSTS:
            cluster.hide_path(host, project)
            caches[host] = cluster.own_dir(host, CACHE)
        yield Setup(cluster, project, caches)


def _lines(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    return sorted(result.stdout.decode().splitlines())


def test_hosts_cannot_see_the_project_without_workdir(setup: Setup) -> None:
    result = run_distrun(
        "-H", "h1:1", "python3", "-c", f"import os; print(os.listdir({str(setup.project)!r}))",
        env=setup.cluster.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "[0] []"


def test_first_launch_sends_then_nothing_then_only_the_edit(setup: Setup, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    first = setup.launch(report=report)
    assert first.returncode == 0, first.stderr.decode()
    lines = _lines(first)
    assert len(lines) == 2 and all("value=1 secret=False" in line for line in lines), lines
    sent = json.loads(report.read_text())["workdir"]
    assert sent["files"] == 3 and sent["bytes_sent"] > 0
    assert {h: v["files_sent"] for h, v in sent["hosts"].items()} == {"h1": 3, "h2": 3}
    # The launcher fed one host; that host fed the other.
    (seed,) = [h for h, v in sent["hosts"].items() if not v["fed_by"]]
    (fed,) = [v for v in sent["hosts"].values() if v["fed_by"]]
    assert fed["fed_by"] == [seed] and fed["bytes_sent"] == 0 and fed["bytes_from_peers"] > 0
    copy = CACHE / "workdir" / "trees" / sent["manifest_hash"]
    assert all(f"cwd={copy}" in line for line in lines)
    secret = hashlib.sha256((setup.project / "secret.txt").read_bytes()).hexdigest()
    for host in HOSTS:
        assert secret not in {p.parent.name + p.name for p in setup.objects(host)}
        backing = setup.caches[host] / "workdir" / "trees" / sent["manifest_hash"]
        # The ranks' bytecode, where Python writes it, stays in the copy (docs/workdir.md).
        assert sorted(set(os.listdir(backing)) - {"__pycache__"}) == [".gitignore", "mod.py", "train.py"]

    second = setup.launch(report=report)
    assert second.returncode == 0, second.stderr.decode()
    assert json.loads(report.read_text())["workdir"]["bytes_sent"] == 0
    assert "sent 0 B to 0 hosts" in second.stderr.decode()

    (setup.project / "mod.py").write_text("VALUE = 2\n")
    edited = setup.launch(report=report)
    assert edited.returncode == 0, edited.stderr.decode()
    assert all("value=2" in line for line in _lines(edited))
    hosts = json.loads(report.read_text())["workdir"]["hosts"]
    assert {h: v["files_sent"] for h, v in hosts.items()} == {"h1": 1, "h2": 1}


def test_check_says_which_hosts_hold_the_copy(setup: Setup) -> None:
    (setup.project / "notes.txt").write_text(f"a version no host has: {time.time()}\n")
    env = setup.cluster.env(PYTHONPATH=str(REPO))
    check = ("check", "-H", "h1,h2", "--workdir", setup.project)
    before = run_distrun(*check, env=env, timeout=300)
    assert before.returncode == 0, before.stdout.decode() + before.stderr.decode()
    assert ": to send to h1, h2" in before.stdout.decode()
    launched = setup.launch()
    assert launched.returncode == 0, launched.stderr.decode()
    after = run_distrun(*check, env=env, timeout=300)
    assert ": cached on h1, h2" in after.stdout.decode()


def test_a_host_with_another_torch_is_refused(setup: Setup, tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    fake = tmp_path / "version.py"
    text = version_py.read_text()
    theirs = next(line for line in text.splitlines() if line.startswith("__version__"))
    fake.write_text(text.replace(theirs, "__version__ = '2.12.0'"))
    ours = theirs.split("=", 1)[1].strip().strip("'\"")
    setup.cluster.bind("h2", fake, version_py)
    try:
        refused = setup.launch()
        assert refused.returncode == 3, refused.stderr.decode()
        err = refused.stderr.decode()
        assert f"h2: torch 2.12.0, others {ours}" in err
        assert "rank=" not in refused.stdout.decode()
        allowed = setup.launch("--allow-mismatch")
        assert allowed.returncode == 0, allowed.stderr.decode()
        assert "--allow-mismatch: running anyway" in allowed.stderr.decode()
        checked = run_distrun(
            "check", "-H", "h1,h2", env=setup.cluster.env(PYTHONPATH=str(REPO)), timeout=300
        )
        out = checked.stdout.decode()
        assert checked.returncode == 3, out
        assert f"h2: problem: a different stack: torch 2.12.0, others {ours}; fix:" in out
        assert "h1: problem" not in out
    finally:
        subprocess.run(
            ["nsenter", "-t", str(setup.cluster.sshd_pid("h2")), "-m", "--", "umount", str(version_py)],
            check=True,
        )


def test_a_transfer_cut_midway_then_a_correct_run(setup: Setup, tmp_path: Path) -> None:
    data = setup.project / "data"
    data.mkdir(exist_ok=True)
    for i in range(48):  # incompressible, so the transfer takes a while and can be cut half-way
        (data / f"part{i:02d}.bin").write_bytes(os.urandom(1 << 20))
    before = len(setup.objects("h2"))
    proc = start_distrun(
        # From the launcher only: the agent link is what is cut (a peer would feed h2 too fast to catch).
        "-H", "h1:1,h2:1", "--workdir", setup.project, "--no-workdir-relay", "--ssh-keepalive", "0.5",
        "train.py",
        env=setup.cluster.env(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    with never_left_running(proc):
        try:
            wait_until(
                lambda: len(setup.objects("h2")) >= before + 2 or proc.poll() is not None,
                120,
                "the first objects on h2",
                every=0.01,  # the cut must come half-way through the transfer
            )
            setup.cluster.link_down("h2")
            cut_at = len(setup.objects("h2")) - before
            _, err = proc.communicate(timeout=60)
        finally:
            setup.cluster.link_up("h2")
    assert 0 < cut_at < 48, f"the cut came at {cut_at} of 48 objects: not half-way"
    assert proc.returncode == 3, err.decode()
    assert "h2" in err.decode()
    left = setup.cluster.wait_clean(timeout=30)
    assert left == {}, {h: [p.cmdline() for p in procs] for h, procs in left.items()}

    report = tmp_path / "report.json"
    again = setup.launch(report=report)
    assert again.returncode == 0, again.stderr.decode()
    expected = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(data.glob("*")))).hexdigest()[:16]
    lines = _lines(again)
    assert len(lines) == 2 and all(f"data={expected}" in line for line in lines), lines
    hosts = json.loads(report.read_text())["workdir"]["hosts"]
    # h2 kept the objects that arrived whole before the cut: only the rest travels.
    total = json.loads(report.read_text())["workdir"]["files"]
    assert hosts["h2"]["files_sent"] <= total - cut_at


def test_a_peer_that_cannot_be_reached_is_replaced_by_the_launcher(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(len(HOSTS))
    project = _project(tmp_path / "proj")
    for host in HOSTS:
        cluster.own_dir(host, CACHE)
    # Each host's TCP to the other is dropped (SSH from this machine still works): no peer can feed another.
    cluster.block_tcp("h1", cluster.addr("h2"))
    cluster.block_tcp("h2", cluster.addr("h1"))
    report = tmp_path / "report.json"
    result = run_distrun(
        "-H", "h1:1,h2:1", "--workdir", project, "-v", "--report", report, "train.py",
        env=cluster.env(PYTHONPATH=str(REPO)), timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert all("value=1" in line for line in _lines(result)) and len(_lines(result)) == 2
    assert "fetching the workdir failed" in result.stderr.decode()
    hosts = json.loads(report.read_text())["workdir"]["hosts"]
    assert all(v["fed_by"] == [] and v["bytes_sent"] > 0 and v["files_sent"] == 3 for v in hosts.values())


WAITING = """\
import os, pathlib, sys, time, mod
marks = pathlib.Path(sys.argv[1])
if len(sys.argv) > 2:  # the long job: says it runs, then waits for the word
    (marks / f"ready.{os.environ['RANK']}").touch()
    while not (marks / "go").exists():
        time.sleep(0.02)
text = pathlib.Path("mod.py").read_text()
print(f"value={mod.VALUE} same={text == 'VALUE = %d' % mod.VALUE + chr(10)}")
"""


def test_jobs_at_once_keep_their_own_copies_while_later_ones_prune(setup: Setup, tmp_path: Path) -> None:
    """A job runs on version 1 while four more versions launch and finish: pruning (3 copies a project)
    leaves the running job's copy alone, and every job sees its own version."""
    project = tmp_path / "proj2"
    project.mkdir()
    (project / "train.py").write_text(WAITING)
    (project / "mod.py").write_text("VALUE = 1\n")
    for host in HOSTS:
        setup.cluster.hide_path(host, project)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = setup.cluster.env(PYTHONPATH=str(REPO))
    hosts = ",".join(f"{h}:1" for h in HOSTS)
    with never_left_running(
        start_distrun("-H", hosts, "--workdir", project, "train.py", marks, "wait", env=env)
    ) as first:
        wait_for_files(marks, "ready.*", len(HOSTS), timeout=120)
        trees = {
            h: {p.name for p in (setup.caches[h] / "workdir" / "trees").iterdir() if p.is_dir()}
            for h in HOSTS
        }
        for version in range(2, 6):
            (project / "mod.py").write_text(f"VALUE = {version}\n")
            later = run_distrun("-H", hosts, "--workdir", project, "train.py", marks, env=env, timeout=120)
            assert later.returncode == 0, later.stderr.decode()
            assert _lines(later) == [f"[{r}] value={version} same=True" for r in range(len(HOSTS))]
        for host in HOSTS:
            now = {p.name for p in (setup.caches[host] / "workdir" / "trees").iterdir() if p.is_dir()}
            assert trees[host] <= now, "the running job's copy (and the other project's) were kept"
            assert len(now - trees[host]) == 3, "of versions 2-5, the oldest was pruned (3 kept a project)"
        (marks / "go").touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err.decode()
    assert sorted(out.decode().splitlines()) == [f"[{r}] value=1 same=True" for r in range(len(HOSTS))]


EDITING = """\
import os, pathlib, sys
v = pathlib.Path("v.txt")
said = v.read_text().strip()
if len(sys.argv) > 1:  # a careless rank rewrites its file in place (root ignores the missing write bit)
    with open(v, "r+") as f:
        f.write("EDITED")
print(f"read={said}")
"""


def test_a_rank_that_edits_its_copy_changes_no_later_job_on_any_host(setup: Setup, tmp_path: Path) -> None:
    """Issue 27, item 1: h1's rank rewrites v.txt; the next job on h1 and h2 (sent fresh) reads the original
    on both, and the object the edit went through is sent again."""
    project = tmp_path / "proj3"
    project.mkdir()
    (project / "train.py").write_text(EDITING)
    (project / "v.txt").write_text("original\n")
    for host in HOSTS:
        setup.cluster.hide_path(host, project)
    env = setup.cluster.env(PYTHONPATH=str(REPO))
    edit = run_distrun("-H", "h1:1", "--workdir", project, "train.py", "edit", env=env, timeout=120)
    assert edit.returncode == 0, edit.stderr.decode()
    assert edit.stdout.decode().splitlines() == ["[0] read=original"]

    report = tmp_path / "report.json"
    both = run_distrun(
        "-H", "h1:1,h2:1", "--workdir", project, "-v", "--report", report, "train.py", env=env, timeout=120
    )
    assert both.returncode == 0, both.stderr.decode()
    assert _lines(both) == ["[0] read=original", "[1] read=original"]
    hosts = json.loads(report.read_text())["workdir"]["hosts"]
    assert {h: v["files_sent"] for h, v in hosts.items()} == {"h1": 1, "h2": 2}
    assert "sent 0 B to 0 hosts" not in both.stderr.decode()


def test_a_file_gitignore_kept_from_the_hosts_is_named_at_launch_and_when_missing(setup: Setup) -> None:
    """The hosts cannot see the project: secret.txt, which .gitignore leaves out, is named at launch with its
    size, and a rank that opens it fails with FileNotFoundError, which the summary names as left out."""
    script = setup.project / "read_secret.py"
    script.write_text("print(open('secret.txt').read())\n")
    try:
        done = run_distrun(
            "-H", "h1:1", "--workdir", setup.project, "read_secret.py",
            env=setup.cluster.env(PYTHONPATH=str(REPO)), timeout=180,
        )  # fmt: skip
    finally:
        script.unlink()
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert (
        f"--workdir {setup.project}: git's ignore rules (.gitignore) leave out 1 file (26 B) that the ranks "
        "will not find in the copy: secret.txt; to send it, have git track it (git add -f secret.txt"
    ) in err, err
    assert (
        f"rank 0 did not find secret.txt: --workdir {setup.project} has it, but git's ignore rules left it "
        "out of the copy the ranks run in"
    ) in err, err
    assert setup.cluster.wait_clean(timeout=10.0) == {}


def test_a_full_disk_on_a_host_leaves_nothing_that_fails_later_syncs(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Issue 27, item 2, over SSH: h1's cache is a 3 MiB tmpfs; a 4 MiB project fails there with the host's
    error and leaves no unfinished file, and a small project then runs, twice."""
    disk = tmp_path / "disk"
    disk.mkdir()
    # Mounted before the cluster exists: its hosts' mount namespaces start as copies of this machine's.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
    try:
        cluster = make_cluster(1)
        CACHE.mkdir(parents=True, exist_ok=True)
        cluster.bind("h1", disk, CACHE)
        env = cluster.env(PYTHONPATH=str(REPO))
        big = tmp_path / "big"
        big.mkdir()
        (big / "train.py").write_text("print('big')\n")
        for i in range(4):
            (big / f"part{i}.bin").write_bytes(os.urandom(1 << 20))
        small = tmp_path / "small"
        small.mkdir()
        (small / "train.py").write_text("print('small')\n")
        # More than the cut sync left free, less than the disk: what that sync stored is given up for it.
        (small / "data.bin").write_bytes(os.urandom(3 << 19))
        for project in (big, small):
            cluster.hide_path("h1", project)
        cut = run_distrun("-H", "h1:1", "--workdir", big, "train.py", env=env, timeout=120)
        assert cut.returncode == 3, cut.stderr.decode()
        assert "h1" in cut.stderr.decode() and "No space left on device" in cut.stderr.decode()
        assert os.listdir(disk / "workdir" / "tmp") == []
        for attempt in range(2):
            fits = run_distrun("-H", "h1:1", "--workdir", small, "train.py", env=env, timeout=120)
            assert fits.returncode == 0, f"attempt {attempt}: {fits.stderr.decode()}"
            assert fits.stdout.decode().splitlines() == ["[0] small"]
        assert os.listdir(disk / "workdir" / "tmp") == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
