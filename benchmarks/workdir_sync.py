"""--workdir: a 50 MiB project to every simulated host, distrun against rsync over OpenSSH to every host.

    sudo python benchmarks/workdir_sync.py [--hosts 8 32] [--mib 50]

Needs root, iproute2, openssh-server and rsync (it builds the simulated cluster of tests/multihost/cluster.py;
every host gets a ~/.cache of its own). The project is a quarter source-like text (compressible, a thousand
small files) and three quarters random bytes (1 MiB files, as weights or data would be). Cases, side by side
on the same cluster, each first with empty caches ("first") and then again unchanged ("second"):

  distrun              `distrun -H h1:1,...,hN:1 --workdir DIR true`: connect, probe, sync, run `true`
  distrun, no relay    the same with --no-workdir-relay: the launcher sends every host its copy itself
  distrun, no workdir  `distrun ... true` without --workdir: what the launch costs without any sync
  rsync                one `rsync -az -e ssh DIR/ hI:cache/` per host, all started at once (SkyPilot's way)

Besides wall time: bytes the launcher sent (from distrun's --report; rsync's own totals). Every host runs on
this same machine, so CPU, not the network, bounds all cases; on real hosts the uplink does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, distrun

from tests.multihost.cluster import Cluster, unavailable_reason

CACHE = Path("~root/.cache/distrun").expanduser()


def make_project(root: Path, mib: int) -> None:
    text_bytes = (mib // 4) << 20
    src = root / "src"
    src.mkdir(parents=True)
    line = "def f(x):\n    return [i * x for i in range(100)]  # a line of code\n"
    per_file = text_bytes // 1000
    for i in range(1000):
        (src / f"mod{i:04d}.py").write_text((line * (per_file // len(line) + 1))[:per_file])
    data = root / "data"
    data.mkdir()
    for i in range(mib - mib // 4):
        (data / f"part{i:03d}.bin").write_bytes(os.urandom(1 << 20))


def clear(caches: dict[str, Path]) -> None:
    for backing in caches.values():
        for child in backing.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def run_distrun(cluster: Cluster, hosts: list[str], *extra: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = distrun("-H", ",".join(f"{h}:1" for h in hosts), "--report", report, *extra, "true")
        env = cluster.env(PYTHONPATH=str(REPO))
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, check=False)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode().strip().splitlines()[-1])
        workdir = json.loads(report.read_text()).get("workdir")
        return wall, workdir["bytes_sent"] if workdir else 0


def run_rsync(cluster: Cluster, hosts: list[str], project: Path) -> tuple[float, int]:
    ssh = f"ssh -F {cluster.ssh_config_path}"
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["rsync", "-az", "--stats", "-e", ssh, f"{project}/", f"{host}:{CACHE}/rsync/"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for host in hosts
    ]
    sent = 0
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(err.decode().strip().splitlines()[-1])
        for line in out.decode().splitlines():
            if line.startswith("Total bytes sent:"):
                sent += int(line.split(":")[1].strip().replace(",", ""))
    return time.perf_counter() - started, sent


# name, and distrun's options (None: rsync); WORKDIR stands for `--workdir DIR`.
WORKDIR = "--workdir"
CASES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("distrun", (WORKDIR,)),
    ("distrun, no relay", (WORKDIR, "--no-workdir-relay")),
    ("distrun, no workdir", ()),
    ("rsync", None),
)


def run_case(
    cluster: Cluster, hosts: list[str], project: Path, options: tuple[str, ...] | None
) -> tuple[float, int]:
    if options is None:
        return run_rsync(cluster, hosts, project)
    extra = [part for o in options for part in ((o, str(project)) if o == WORKDIR else (o,))]
    return run_distrun(cluster, hosts, *extra)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):9.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--mib", type=int, default=50)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is None and shutil.which("rsync") is None:
        reason = "needs rsync (apt-get install rsync)"
    if reason is not None:
        sys.exit(f"workdir_sync: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "proj"
        make_project(project, args.mib)
        size = sum(p.stat().st_size for p in project.rglob("*") if p.is_file())
        files = sum(1 for p in project.rglob("*") if p.is_file())
        print(f"project: {files} files, {size / (1 << 20):.1f} MiB; machine: {os.cpu_count()} cores")
        print(f"{'hosts':>5}  {'case':<20} {'first s':>8} {'sent MiB':>9} {'second s':>9} {'sent MiB':>9}")
        with Cluster(max(args.hosts), login_rc=False) as cluster:
            caches = {h: cluster.own_dir(h, CACHE) for h in cluster.hosts}
            for count in args.hosts:
                hosts = cluster.hosts[:count]
                results = {}
                for name, options in CASES:
                    clear(caches)
                    try:
                        first = run_case(cluster, hosts, project, options)
                        results[name] = (first, run_case(cluster, hosts, project, options))
                    except RuntimeError as err:
                        print(f"{count:>5}  {name:<20} failed: {err}")
                        continue
                    (t1, s1), (t2, s2) = results[name]
                    print(f"{count:>5}  {name:<20} {t1:8.2f} {_mib(s1)} {t2:9.2f} {_mib(s2)}")
                if "distrun" in results and "rsync" in results:
                    (d1, _), (d2, _) = results["distrun"]
                    (r1, _), (r2, _) = results["rsync"]
                    print(f"{count:>5}  rsync/distrun wall: first {r1 / d1:.2f}x, second {r2 / d2:.2f}x")


if __name__ == "__main__":
    main()
