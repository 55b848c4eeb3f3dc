"""A real Slurm cluster on one Linux machine: slurmctld and one slurmd per node, each in its own namespace.

Built on the simulated network of tests/multihost/cluster.py (``Cluster(names=..., sshd=False)``): a bridge,
one network namespace per host, /etc/netns hosts files. Here the hosts are ``ctl`` (slurmctld and this
cluster's own munged) and ``node01..nodeNN`` (one slurmd each, no sshd), so a job's ``SLURM_JOB_NODELIST`` is
``node[01-03]``, zero padding included. Usage::

    from tests.slurm.cluster import SlurmCluster
    with SlurmCluster(3) as slurm:
        subprocess.run(["srun", "-N3", "hostname"], env=slurm.env())   # node01 node02 node03

The root namespace is the login node: ``srun``/``salloc``/``sbatch`` run there with ``env()`` (SLURM_CONF
names this cluster's slurm.conf) and reach slurmctld over the bridge. The nodes share this machine's file
system, so the repository and its virtual environment are at the same path on every node, as on a cluster with
a shared home.

What running Slurm 22.05 in namespaces on a 2-core machine needs:

* each daemon starts as ``nsenter --net=/run/netns/NS unshare --uts --mount``, then bind-mounts the
  namespace's hosts/resolv.conf/nsswitch.conf over /etc itself. ``ip netns exec`` would do the bind mounts
  but also remounts /sys, which hides /sys/fs/cgroup, and slurmd 22.05 loads its cgroup plugin whatever
  ProctrackType says and dies without it. Everything a job starts inherits the node's hostname, /etc/hosts
  and network namespace;
* ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` (no cgroups),
  ``SlurmdParameters=config_overrides`` (every node claims ``CPUs`` of the same 2 real cores), ``NodeAddr``
  per node, ``SlurmdUser=root``, and a spool directory per node created before its slurmd starts;
* one munged of our own (``AuthInfo=socket=...``) in the ``ctl`` namespace: its Unix socket is a path in
  the shared file system, so every namespace reaches it, and it is never the machine's munged.

Teardown is the network's: every process in the cluster's namespaces (daemons, slurmstepd, job tasks,
munged) is stopped and the namespaces removed; ``python -m tests.multihost.cluster cleanup`` also covers a
SlurmCluster whose test run was killed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psutil

from tests.multihost.cluster import (
    SBIN_PATH,
    Cluster,
    ClusterError,
    ClusterUnavailable,
    impossible_reason,
    missing_tool_reason,
)

log = logging.getLogger(__name__)

CONTROLLER = "ctl"
DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")
CLIENTS = ("srun", "salloc", "sbatch", "sinfo", "scontrol", "scancel", "squeue")
READY_TIMEOUT = 30.0
PACKAGES = "slurm-wlm slurmctld slurmd slurm-client munge"


def slurm_missing_tool_reason() -> str | None:
    """Which package the Slurm fixture needs and this machine lacks, or None."""
    reason = missing_tool_reason()
    if reason is not None:
        return reason
    for tool in DAEMONS + CLIENTS:
        if shutil.which(tool, path=SBIN_PATH) is None:
            return f"the Slurm tests need `{tool}` (apt-get install {PACKAGES})"
    return None


def slurm_unavailable_reason() -> str | None:
    """Why this machine cannot run the Slurm fixture now, or None when it can."""
    return impossible_reason() or slurm_missing_tool_reason()


def _tool(name: str) -> str:
    found = shutil.which(name, path=SBIN_PATH)
    assert found is not None, name
    return found


class SlurmCluster:
    """`num_nodes` Slurm nodes `node01..` and a controller, built on construction, removed by `close()`."""

    def __init__(self, num_nodes: int = 3, *, cpus: int = 4) -> None:
        """`cpus` is what each node tells Slurm it has (config_overrides: all share the machine's cores)."""
        reason = slurm_unavailable_reason()
        if reason is not None:
            raise ClusterUnavailable(reason)
        started = time.monotonic()
        self.nodes = [f"node{i:02d}" for i in range(1, num_nodes + 1)]
        self.network = Cluster(names=[CONTROLLER, *self.nodes], sshd=False)
        self.dir = self.network.workdir / "slurm"
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        try:
            self._write_config(cpus)
            self._start_daemons()
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.up_seconds = time.monotonic() - started
        log.info("%r up in %.2fs", self, self.up_seconds)

    @property
    def conf_path(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for Slurm commands on the login node (the root namespace): this cluster's slurm.conf,
        and none of the SLURM_* variables of a job the test run itself may be part of."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISTRUN_"))}
        env["SLURM_CONF"] = str(self.conf_path)
        env.update(extra)
        return env

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (`srun ...`) on the login node and return its output as text."""
        proc = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def processes(self, node: str) -> list[psutil.Process]:
        """What runs on `node` besides its slurmd: a finished job leaves nothing here."""
        slurmd = self._daemons[node].pid
        return [p for p in self.network.processes(node) if p.pid != slurmd]

    def wait_clean(self, timeout: float = 15.0) -> dict[str, list[psutil.Process]]:
        """Wait until every node runs only its slurmd; returns what is still left (empty when clean).

        After a job ends slurmstepd takes a moment (KillWait, epilog) to exit, hence the wait.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = {node: procs for node in self.nodes if (procs := self.processes(node))}
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no job is left in the queue, so the next test gets the nodes at once."""
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-o", "%i"]).stdout.strip():
            if time.monotonic() >= deadline:
                raise ClusterError(f"jobs still queued after {timeout}s: {self.run(['squeue']).stdout}")
            time.sleep(0.1)

    def close(self) -> None:
        """Stop every daemon and job process and remove the network. Idempotent."""
        self.network.close()
        for proc in self._daemons.values():
            if proc.poll() is None:  # not in a namespace yet when set-up failed half-way
                proc.kill()
            proc.wait()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SlurmCluster(nodes={len(self.nodes)}, network={self.network!r})"

    def _write_config(self, cpus: int) -> None:
        for name in (CONTROLLER, *self.nodes):
            (self.dir / name / "spool").mkdir(parents=True)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        net = self.network
        lines = [
            f"ClusterName=distrun{net.id}",
            f"SlurmctldHost={CONTROLLER}({net.addr(CONTROLLER)})",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.dir / 'munge.socket'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.dir / CONTROLLER / 'spool'}",
            f"SlurmctldPidFile={self.dir / CONTROLLER / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.dir / CONTROLLER / 'slurmctld.log'}",
            f"SlurmdSpoolDir={self.dir}/%n/spool",
            f"SlurmdPidFile={self.dir}/%n/slurmd.pid",
            f"SlurmdLogFile={self.dir}/%n/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            # Left at Slurm's default on purpose: tasks of a step whose srun was killed keep running, as on
            # most real clusters, so the tests see what distrun's own clean-up achieves.
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=2",
            *(f"NodeName={node} NodeAddr={net.addr(node)} CPUs={cpus} State=UNKNOWN" for node in self.nodes),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf_path.write_text("\n".join(lines) + "\n")

    def _spawn(self, host: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        netns = self.network.netns(host)
        etc = Path("/etc/netns") / netns
        binds = " && ".join(
            f"mount --bind {etc / name} /etc/{name}" for name in ("hosts", "resolv.conf", "nsswitch.conf")
        )
        script = f'{binds} && hostname {host} && exec "$@"'
        with open(self.dir / host / "daemon.out", "ab") as out:
            return subprocess.Popen(
                [
                    *("nsenter", f"--net=/run/netns/{netns}"),
                    *("unshare", "--uts", "--mount", "--propagation", "private"),
                    *("sh", "-c", script, "sh", *argv),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self.env(),
                # Own session: a Ctrl-C aimed at the test run must not stop the daemons before teardown does.
                start_new_session=True,
            )

    def _start_daemons(self) -> None:
        munge = self.dir / CONTROLLER / "munged"
        self._daemons["munged"] = self._spawn(
            CONTROLLER,
            [
                _tool("munged"),
                *("--foreground", "--force", f"--socket={self.dir / 'munge.socket'}"),
                f"--key-file={self.dir / 'munge.key'}",
                f"--log-file={munge}.log",
                f"--pid-file={munge}.pid",
                f"--seed-file={munge}.seed",
            ],
        )
        conf = str(self.conf_path)
        self._daemons[CONTROLLER] = self._spawn(CONTROLLER, [_tool("slurmctld"), "-D", "-i", "-f", conf])
        for node in self.nodes:
            self._daemons[node] = self._spawn(node, [_tool("slurmd"), "-D", "-N", node, "-f", conf])

    def _wait_ready(self) -> None:
        """Until `sinfo` says every node is idle; a daemon that exits meanwhile fails at once, with logs."""
        deadline = time.monotonic() + READY_TIMEOUT
        want = f"idle {len(self.nodes)}"
        while True:
            for name, proc in self._daemons.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name}: exited with {proc.returncode}: {self._log_tail(name)}")
            sinfo = self.run(["sinfo", "-h", "-o", "%T %D"], check=False)
            if sinfo.returncode == 0 and sinfo.stdout.strip() == want:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes not idle after {READY_TIMEOUT}s: {sinfo.stdout}{sinfo.stderr}")
            time.sleep(0.05)

    def _log_tail(self, name: str) -> str:
        """The daemon's own log and what it wrote to stdout/stderr (the ctl host holds two daemons' logs)."""
        host = CONTROLLER if name == "munged" else name
        logs = [*sorted((self.dir / host).glob("*.log")), self.dir / host / "daemon.out"]
        text = "".join(p.read_text(errors="replace") for p in logs if p.exists())
        return text.strip()[-2000:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurm.cluster", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    bench = sub.add_parser("bench", help="time bring-up and teardown")
    bench.add_argument("nodes", type=int, nargs="?", default=3)
    bench.add_argument("--repeat", type=int, default=3)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C (for manual testing)")
    up.add_argument("nodes", type=int, nargs="?", default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "bench":
        for _ in range(args.repeat):
            cluster = SlurmCluster(args.nodes)
            started = time.monotonic()
            cluster.close()
            print(f"{args.nodes} nodes: up {cluster.up_seconds:.2f}s  down {time.monotonic() - started:.2f}s")
    else:
        with SlurmCluster(args.nodes) as cluster:
            log.info("SLURM_CONF=%s srun -N%d hostname", cluster.conf_path, args.nodes)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
