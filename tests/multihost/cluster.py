"""A simulated SSH cluster on one Linux machine: network namespaces, a bridge, and a real sshd per host.

Used by the multihost tests and by the fan-out benchmark, so it depends on the stdlib and psutil only and
works outside pytest::

    from tests.multihost.cluster import Cluster
    with Cluster(4) as cluster:
        subprocess.run(["ssh", "-F", str(cluster.ssh_config_path), "h2", "hostname"])   # prints h2
        subprocess.run(cluster.launcher_argv(["distrun", "-H", "h1:2,h2:1", "hostname"]), env=cluster.env())

Layout (X is picked per cluster so that concurrent clusters never share a subnet):

* a bridge ``drbr<id>`` in the root namespace with 198.18.X.1/24. 198.18.0.0/15 is reserved for benchmarking
  (RFC 2544), so it does not clash with real networks. The root namespace stands in for the machine distrun
  is launched from: it is on the test network, as a real launch host is.
* per host ``hI``: a network namespace ``dr<id>-hI`` holding ``eth0`` (a veth whose peer ``drv<id>hI`` is on
  the bridge) with 198.18.X.(10+I), ``lo`` up and a default route via the bridge. A policy-routing rule in
  the root namespace makes anything arriving from the bridge and not addressed to this machine unreachable,
  so that even with ``ip_forward=1`` no test traffic can leave the machine.
* every host's ``eth0`` has a fixed MAC address, and every host knows every other's (permanent neighbour
  entries): when 32 hosts on one kernel's bridge all ARP for their peers at once (a torch.distributed group
  forming), the flood of broadcasts lost SYNs for 35 s and more, which no real switch does; the bridge's
  address is still resolved by ARP.
* ``/etc/netns/<ns>/hosts`` maps every ``hI`` (and ``launcher``, the bridge address) to its test address and
  ``/etc/netns/<ns>/resolv.conf`` has no nameserver and ``nsswitch.conf`` only ``hosts: files``, so name
  lookups inside the hosts never use DNS. ``ip netns exec`` bind-mounts these over /etc, and every process
  started through that host's sshd inherits them.
* a real OpenSSH sshd per host, started as
  ``ip netns exec NS unshare --uts sh -c 'hostname hI; exec sshd -D'``, so the host has its own hostname and
  everything started through ssh inherits it.

How the launch machine reaches hosts by name, without editing /etc/hosts or ever asking DNS:

* ssh: ``ssh_config_path`` has a ``Host hI / HostName 198.18.X.(10+I)`` block per host plus the test key,
  known_hosts file and ``StrictHostKeyChecking yes``; ``home`` is a directory whose ``.ssh/`` holds the same
  config, known_hosts and key under OpenSSH's default names. Running distrun with ``env()`` (HOME=home, no
  ssh-agent) exercises the path real users take: only ``~/.ssh`` tells distrun how to reach ``h1``. OpenSSH's
  own ``ssh`` takes ``~`` from the password database, not $HOME, so give it ``-F cluster.ssh_config_path``.
* name lookups by the launcher itself (is ``h1`` this machine? which address does rank 0 have?): wrap the
  command with ``launcher_argv(argv)``. It runs in a private mount namespace that sees this machine's
  /etc/hosts plus the test hosts, a resolv.conf without nameserver and a files-only nsswitch.conf, as on a
  real cluster whose DNS knows its hosts. Without the wrapper, ``h1`` does not resolve on the launch machine,
  and glibc would ask the machine's real nameserver: tests must not do that.

This leaves the machine's /etc/hosts alone and lets two clusters with the same host names run side by side.
``Cluster(n, etc_hosts=True)`` is the fallback for code that cannot be wrapped: it appends lines to the
machine's /etc/hosts, each ending in ``# distrun-cluster <id>``, and removes exactly those lines on close.

Teardown (``close()``, also ``with``, ``atexit``, and after a failed start) kills every process whose
network namespace is one of the cluster's (the sshds and anything started through them), then removes the
namespaces, veths, bridge, routing rule, /etc/netns entries, /etc/hosts lines and the temp dir. Each cluster
records what it created under /run/distrun-cluster/; ``python -m tests.multihost.cluster cleanup`` removes
clusters whose owning process has died (a test run killed with SIGKILL).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

log = logging.getLogger(__name__)

SSHD = Path("/usr/sbin/sshd")
# Where Debian puts ip, nft and sshd, which a non-login root shell may not have on PATH.
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
SSH_KEYGEN = "ssh-keygen"
SUBNET_PREFIX = "198.18"
STATE_DIR = Path("/run/distrun-cluster")
LOCK_FILE = STATE_DIR / "lock"
ETC_NETNS = Path("/etc/netns")
ETC_HOSTS = Path("/etc/hosts")
ETC_RESOLV = Path("/etc/resolv.conf")
ETC_NSSWITCH = Path("/etc/nsswitch.conf")
# Table and rule preference for the "nothing leaves the machine" guard; offset by the subnet's third octet.
GUARD_BASE = 21300
# Host I has address 10+I in the cluster's subnet: .11 .. .254 of a /24, and beyond 244 hosts, of a /23 (two
# adjacent /24s X and X+1, X even) up to (X+1).254.
HOSTS_PER_24 = 244
MAX_HOSTS = 500
READY_TIMEOUT = 15.0


class ClusterUnavailable(RuntimeError):
    """The machine cannot build a simulated cluster at all (not root, no netns support, no sshd)."""


class ClusterError(RuntimeError):
    """Building or driving the cluster failed although the machine should support it."""


def impossible_reason() -> str | None:
    """Why this machine can never host a simulated cluster (no installing changes it), or None."""
    if sys.platform != "linux":
        return "simulated cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return "simulated cluster needs root (network namespaces, veth, sshd)"
    if not Path("/proc/self/ns/net").exists():
        return "kernel has no network namespace support"
    return None


def missing_tool_reason() -> str | None:
    """Which package the simulated cluster needs and this machine lacks, or None."""
    for tool in ("ip", "unshare", "nsenter", SSH_KEYGEN, "ssh"):
        if shutil.which(tool, path=SBIN_PATH) is None:
            return f"simulated cluster needs `{tool}` (apt-get install iproute2 util-linux openssh-client)"
    if not SSHD.exists():
        return f"simulated cluster needs {SSHD} (apt-get install openssh-server)"
    return None


def unavailable_reason() -> str | None:
    """Why this machine cannot host a simulated cluster now, or None when it can."""
    return impossible_reason() or missing_tool_reason()


@dataclass(frozen=True)
class SimHost:
    """One simulated host and the names of everything created for it."""

    name: str
    index: int
    addr: str
    netns: str
    veth: str
    dir: str


@dataclass(frozen=True)
class CpuLimit:
    """A cgroup with a CPU quota (see Cluster.cpu_limited)."""

    group: Path

    def add(self, pid: int) -> bool:
        """Move process `pid`, every thread of it, under the quota; False if it is gone already."""
        try:
            (self.group / "cgroup.procs").write_text(str(pid))
        except OSError:
            return False
        return True


@dataclass(frozen=True)
class _State:
    """What a cluster created, persisted so that a later process can tear down a cluster whose owner died."""

    cluster_id: str
    owner_pid: int
    subnet: int
    bridge: str
    netns: tuple[str, ...]
    veths: tuple[str, ...]
    workdir: str
    etc_hosts: bool
    width: int = 1  # how many /24s, from `subnet` on, the cluster's network spans

    @property
    def subnets(self) -> range:
        return range(self.subnet, self.subnet + self.width)

    @property
    def guard(self) -> int:
        return GUARD_BASE + self.subnet


def _files_only_nsswitch() -> str:
    try:
        lines = ETC_NSSWITCH.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    kept = [line for line in lines if not line.strip().startswith("hosts:")]
    return "\n".join([*kept, "hosts:          files", ""])


def _mac(addr: str) -> str:
    """A host's MAC address, from its IPv4 address: locally administered, unique on its bridge."""
    octets = [int(part) for part in addr.split(".")]
    return "02:00:" + ":".join(f"{octet:02x}" for octet in octets)


def _ip_batch(commands: Iterable[str], netns: str | None = None, *, force: bool = False) -> None:
    """Run many `ip` commands in one process: forking ip per command is what makes namespace set-up slow."""
    argv = ["ip"]
    if netns is not None:
        argv += ["-n", netns]
    if force:
        argv.append("-force")  # keep going past errors: used on teardown, where some objects may be gone
    argv += ["-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True, check=False)
    if proc.returncode != 0 and not force:
        raise ClusterError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


@contextlib.contextmanager
def _locked() -> Any:
    """Serialise subnet allocation and /etc/hosts edits between concurrent clusters."""
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _used_subnets() -> set[int]:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    used = set()
    for line in out.splitlines():
        fields = line.split()
        addr = fields[fields.index("inet") + 1] if "inet" in fields else ""
        if addr.startswith(SUBNET_PREFIX + "."):
            used.add(int(addr.split(".")[2]))
    for state_file in STATE_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            raw = json.loads(state_file.read_text())
            used.update(range(int(raw["subnet"]), int(raw["subnet"]) + int(raw.get("width", 1))))
    return used


def _netns_inode(netns: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return None


def _processes_in(inodes: set[int]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.stat(f"/proc/{proc.pid}/ns/net").st_ino in inodes:
                found.append(proc)
        except OSError:
            continue  # exited meanwhile, or a kernel thread we may not inspect
    return found


def _kill_all(procs: list[psutil.Process], grace: float = 2.0) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)


def _remove_etc_hosts_lines(cluster_id: str) -> None:
    marker = f"# distrun-cluster {cluster_id}"
    # Rewritten in place, not replaced: in containers /etc/hosts is often a bind mount.
    with _locked(), contextlib.suppress(FileNotFoundError), open(ETC_HOSTS, "r+") as f:
        lines = f.readlines()
        kept = [line for line in lines if not line.rstrip().endswith(marker)]
        if kept != lines:
            f.seek(0)
            f.writelines(kept)
            f.truncate()


def _teardown(state: _State, known_pids: Sequence[int] = ()) -> None:
    """Remove everything `state` names; safe to call on a partial cluster and more than once."""
    inodes = {ino for ns in state.netns if (ino := _netns_inode(ns)) is not None}
    procs = _processes_in(inodes) if inodes else []
    for pid in known_pids:  # an sshd that never reached its namespace (set-up failed half-way)
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if all(p.pid != pid for p in procs):
                procs.append(proc)
    _kill_all(procs)
    # Deleting a namespace destroys the veth end inside it and with it the peer; the explicit deletes cover
    # veths whose namespace was never created.
    cmds = [f"netns del {ns}" for ns in state.netns if _netns_inode(ns) is not None]
    existing = set(os.listdir("/sys/class/net"))
    cmds += [f"link del {veth}" for veth in state.veths if veth in existing]
    if state.bridge in existing:
        cmds.append(f"link del {state.bridge}")
    cmds += [f"rule del pref {state.guard}", f"route flush table {state.guard}"]
    _ip_batch(cmds, force=True)
    for ns in state.netns:
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
    with contextlib.suppress(OSError):
        ETC_NETNS.rmdir()  # only succeeds when no other cluster (or anything else) uses it
    if state.etc_hosts:
        _remove_etc_hosts_lines(state.cluster_id)
    shutil.rmtree(state.workdir, ignore_errors=True)
    (STATE_DIR / f"{state.cluster_id}.json").unlink(missing_ok=True)


def cleanup_stale() -> list[str]:
    """Tear down clusters whose owning process is gone; returns their ids."""
    removed = []
    for state_file in sorted(STATE_DIR.glob("*.json")):
        try:
            raw = json.loads(state_file.read_text())
            state = _State(**{**raw, "netns": tuple(raw["netns"]), "veths": tuple(raw["veths"])})
        except (OSError, ValueError, TypeError, KeyError):
            log.warning("ignoring unreadable cluster state %s", state_file)
            continue
        if psutil.pid_exists(state.owner_pid):
            continue
        _teardown(state)
        removed.append(state.cluster_id)
    return removed


class Cluster:
    """N simulated hosts `h1..hN`, built on construction and torn down by `close()`."""

    def __init__(
        self,
        num_hosts: int = 3,
        *,
        names: Sequence[str] | None = None,
        sshd: bool = True,
        max_startups: str | None = None,
        session_path: str | None = None,
        etc_hosts: bool = False,
        login_rc: bool = True,
    ) -> None:
        """Build the cluster; on any failure everything built so far is removed before the error propagates.

        `names` replaces `h1..hN` (at most 6 characters each: they end up in interface names). With
        `sshd=False` only the network is built (namespaces, addresses, /etc/netns files) and the caller starts
        its own daemons in it, as tests/slurm does; teardown still stops everything in the namespaces.

        `max_startups` is sshd's MaxStartups (None: sshd's default 10:30:100, which drops bursts of
        handshakes, as on real clusters). `session_path` is PATH for commands run through ssh; the default is
        this process's PATH, as on a cluster whose hosts share the launch machine's filesystem and software.
        `login_rc=False` hides root's ~/.bashrc from the hosts' login shells (Debian's bash reads it for every
        ssh command): where it runs `pyenv init`, every login takes pyenv's one global rehash lock, so
        starting anything on many hosts at once measures that lock rather than SSH.
        """
        reason = unavailable_reason()
        if reason is not None:
            raise ClusterUnavailable(reason)
        names = list(names) if names is not None else [f"h{i}" for i in range(1, num_hosts + 1)]
        if not 1 <= len(names) <= MAX_HOSTS:
            raise ValueError(f"a cluster has 1..{MAX_HOSTS} hosts, not {len(names)}")
        if any(len(name) > 6 for name in names):
            raise ValueError(f"host names must have at most 6 characters: {names}")
        self.id = secrets.token_hex(3)
        self.sshd = sshd
        self.max_startups = max_startups
        self.session_path = session_path if session_path is not None else os.environ.get("PATH", os.defpath)
        self.login_rc = login_rc
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        self._closed = False
        self.subnet = -1
        self._hosts: dict[str, SimHost] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix=f"distrun-cluster-{self.id}-"))
        self._state: _State | None = None
        atexit.register(self.close)
        try:
            self._build(names, etc_hosts)
        except BaseException:
            self.close()
            raise

    @property
    def hosts(self) -> list[str]:
        return list(self._hosts)

    def addr(self, host: str) -> str:
        return self._host(host).addr

    @property
    def bridge_addr(self) -> str:
        """The root namespace's (the launch machine's) address on the test network."""
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    @property
    def ssh_config_path(self) -> Path:
        return self.workdir / "ssh_config"

    @property
    def known_hosts_path(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def key_path(self) -> Path:
        """The client's private key, authorised for root on every host."""
        return self.workdir / "id_ed25519"

    @property
    def home(self) -> Path:
        """A HOME whose ~/.ssh holds config, known_hosts and id_ed25519 for this cluster."""
        return self.workdir / "home"

    def netns(self, host: str) -> str:
        return self._host(host).netns

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a launcher run from the root namespace: HOME points at `home`, no ssh-agent."""
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env["HOME"] = str(self.home)
        env.update(extra)
        return env

    def launcher_argv(self, argv: Sequence[str]) -> list[str]:
        """Wrap `argv` to run on the launch machine (the root network namespace) as on a real cluster whose
        DNS knows the hosts.

        A private mount namespace shows the command this machine's /etc/hosts plus the test hosts, no
        nameserver and a files-only nsswitch.conf; nothing changes for other processes and no lookup reaches
        DNS. Combine with `env()` so that ~/.ssh is the cluster's.
        """
        etc = self.workdir / "launcher-etc"
        binds = [(etc / "hosts", ETC_HOSTS), (etc / "resolv.conf", ETC_RESOLV)]
        if ETC_NSSWITCH.exists():
            binds.append((etc / "nsswitch.conf", ETC_NSSWITCH))
        script = " && ".join(f"mount --bind {src} {dst}" for src, dst in binds) + ' && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]

    def ssh_argv(self, host: str, *command: str) -> list[str]:
        """An OpenSSH client command line that reaches `host` from the root namespace."""
        return ["ssh", "-F", str(self.ssh_config_path), host, *command]

    def run(
        self, host: str, argv: Sequence[str], *, timeout: float = 30.0, check: bool = False, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on `host` directly (no ssh): its network namespace, hostname and /etc/hosts."""
        sshd = self._sshd.get(host)
        if sshd is None or sshd.poll() is not None:
            raise ClusterError(f"{host}: sshd is not running, so its hostname namespace is gone")
        wrapped = ["ip", "netns", "exec", self.netns(host), "nsenter", "-t", str(sshd.pid), "-u", "--", *argv]
        kwargs.setdefault("capture_output", True)
        return subprocess.run(wrapped, timeout=timeout, check=check, text=True, **kwargs)

    def sshd_pid(self, host: str) -> int | None:
        sshd = self._sshd.get(host)
        return sshd.pid if sshd is not None and sshd.poll() is None else None

    def processes(self, host: str) -> list[psutil.Process]:
        """Processes living on `host` (its network namespace), except its listening sshd."""
        inode = _netns_inode(self.netns(host))
        if inode is None:
            return []
        listener = self.sshd_pid(host)
        return [p for p in _processes_in({inode}) if p.pid != listener]

    def commands(self, host: str) -> list[str]:
        """The command lines of `processes(host)`; one that exits meanwhile is left out, not an error (a test
        waiting for a host to empty lists it while its processes exit)."""
        found = []
        for proc in self.processes(host):
            with contextlib.suppress(psutil.Error):
                found.append(" ".join(proc.cmdline()))
        return found

    def wait_clean(self, timeout: float = 10.0) -> dict[str, list[psutil.Process]]:
        """Wait until no host runs anything but its sshd; returns what is still left (empty when clean).

        sshd's per-connection processes take a moment to exit after the client disconnects, hence the wait.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = {h: procs for h in self._hosts if (procs := self.processes(h))}
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def link_down(self, host: str) -> None:
        """Take the host off the network: packets to and from it are dropped silently, like a pulled cable."""
        _ip_batch([f"link set {self._host(host).veth} down"])

    def link_up(self, host: str) -> None:
        _ip_batch([f"link set {self._host(host).veth} up"])

    def stop_sshd(self, host: str) -> None:
        """Stop the host's listening sshd: connections are refused. Established sessions are left alone."""
        sshd = self._sshd.get(host)
        if sshd is not None and sshd.poll() is None:
            sshd.terminate()
            try:
                sshd.wait(5)
            except subprocess.TimeoutExpired:
                sshd.kill()
                sshd.wait()

    def start_sshd(self, host: str) -> None:
        """(Re)start the host's sshd, e.g. after `stop_sshd`; returns once it answers."""
        self.stop_sshd(host)
        self._spawn_sshd(self._host(host))
        self._wait_ready([host])

    def add_password_user(self, host: str, user: str, password: str) -> Path:
        """Give `host` (only) a login `user` with `password`, turn password logins on there; returns its home.

        The user exists only inside that host: `ip netns exec` lays /etc/netns/<ns>/passwd and shadow over
        /etc, so the machine's own files stay untouched. It has uid 0, so that it can run the interpreters and
        code of the shared filesystem; its keys live in its own `~/.ssh/authorized_keys`, which starts absent.
        """
        h = self._host(host)
        home = self.workdir / f"home-{host}-{user}"
        home.mkdir(mode=0o755)
        crypted = subprocess.run(
            ["openssl", "passwd", "-6", "-stdin"], input=password, capture_output=True, text=True, check=True
        ).stdout.strip()
        ns_dir = ETC_NETNS / h.netns
        for name, line in (
            ("passwd", f"{user}:x:0:0:distrun test:{home}:/bin/sh"),
            ("shadow", f"{user}:{crypted}:19000::::::"),
        ):
            own = (Path("/etc") / name).read_text()
            (ns_dir / name).write_text(own.rstrip("\n") + "\n" + line + "\n")
        (ns_dir / "shadow").chmod(0o640)
        config = Path(h.dir) / "sshd_config"
        text = config.read_text()
        for old, new in (
            ("PasswordAuthentication no", "PasswordAuthentication yes"),
            ("PermitRootLogin prohibit-password", "PermitRootLogin yes"),
            (
                f"AuthorizedKeysFile {self.workdir}/authorized_keys",
                f"AuthorizedKeysFile {self.workdir}/authorized_keys .ssh/authorized_keys",
            ),
        ):
            text = text.replace(old, new)
        config.write_text(text)
        self.start_sshd(host)
        return home

    def hide_path(self, host: str, path: Path) -> None:
        """Make `path` (a directory) look empty on `host` only, as on a host that lacks the shared filesystem.

        An empty tmpfs is mounted over it in the mount namespace of the host's sshd, which every session there
        inherits; `ip netns exec` made that namespace a slave of this machine's, so nothing leaks out, and the
        mount goes away with the namespace.
        """
        pid = self.sshd_pid(host)
        if pid is None:
            raise ClusterError(f"{host}: sshd is not running")
        subprocess.run(
            [
                "nsenter",
                "-t",
                str(pid),
                "-m",
                "--",
                "mount",
                "-t",
                "tmpfs",
                "-o",
                "size=1m",
                "tmpfs",
                str(path),
            ],
            check=True,
            capture_output=True,
        )

    def bind(self, host: str, source: Path, target: Path) -> None:
        """Show `source` (a file or directory) at `target` on `host` only, as `hide_path` hides a path: a
        host with a package version or a disk of its own."""
        pid = self.sshd_pid(host)
        if pid is None:
            raise ClusterError(f"{host}: sshd is not running")
        subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "--", "mount", "--bind", str(source), str(target)],
            check=True,
            capture_output=True,
        )

    def own_dir(self, host: str, path: Path) -> Path:
        """Give `host` a directory of its own at `path` (created here if missing, left empty); returns where
        its content lies on this machine, for tests to look at."""
        path.mkdir(parents=True, exist_ok=True)
        backing = Path(self._host(host).dir) / "own" / str(path).strip("/").replace("/", "_")
        backing.mkdir(parents=True, exist_ok=True)
        self.bind(host, backing, path)
        return backing

    def block_tcp(self, host: str, to_addr: str) -> None:
        """A firewall rule inside `host`'s namespace: TCP from it to `to_addr` is dropped (not refused),
        except SSH. Other hosts and this machine are unaffected; the rule goes away with the namespace."""
        rules = (
            "add table inet distrun_test\n"
            "add chain inet distrun_test out { type filter hook output priority 0 ; }\n"
            f"add rule inet distrun_test out ip daddr {to_addr} tcp dport != 22 drop\n"
        )
        proc = subprocess.run(
            ["ip", "netns", "exec", self.netns(host), "nft", "-f", "-"],
            input=rules,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            # Not a skip: a root machine that can build the cluster can install nftables (.ci/run does).
            hint = " (apt-get install nftables)" if shutil.which("nft", path=SBIN_PATH) is None else ""
            raise ClusterError(f"{host}: nft failed{hint}: {proc.stderr.strip()}")

    def shape_link(self, host: str, rate: str = "20mbit") -> None:
        """Slow the host's cable: a token bucket of `rate` on both ends of its veth, as a NIC that negotiated
        a lower speed. Goes away with the veth."""
        qdisc = f"root tbf rate {rate} burst 32kbit latency 400ms"
        for netns, dev in ((None, self._host(host).veth), (self.netns(host), "eth0")):
            prefix = ["ip", "netns", "exec", netns] if netns else []
            proc = subprocess.run(
                [*prefix, "tc", "qdisc", "replace", "dev", dev, *qdisc.split()],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise ClusterError(f"{host}: tc failed: {proc.stderr.strip()}")

    @contextlib.contextmanager
    def cpu_limited(self, host: str, share: float, name: str = "cpu") -> Iterator[CpuLimit]:
        """A cgroup v1 CFS quota of `share` of one CPU for the processes put into it (`CpuLimit.add`), as a
        node throttled or crowded by another job; removed on exit, its processes moved back. Raises
        ClusterUnavailable where this kernel has no cpu cgroup."""
        root = Path("/sys/fs/cgroup/cpu")
        if not (root / "cpu.cfs_quota_us").exists():
            raise ClusterUnavailable("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
        assert self._state is not None
        group = root / f"distrun-{self._state.cluster_id}-{host}-{name}"
        group.mkdir()
        try:
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(100000 * share)))
            yield CpuLimit(group)
        finally:
            # A process forked meanwhile (sshd's child for a new connection) joins the group after it was
            # read, and an exiting one stays listed a moment: move out whatever is there until it goes.
            deadline = time.monotonic() + 10.0
            while True:
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (root / "cgroup.procs").write_text(pid)
                try:
                    group.rmdir()
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                time.sleep(0.05)

    def host_key(self, host: str) -> str:
        """The host's current public key line (`ssh-ed25519 AAAA...`)."""
        key_type, key = (Path(self._host(host).dir) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"{key_type} {key}"

    def rotate_host_key(self, host: str) -> None:
        """Give the host a new host key and restart its sshd; the known_hosts files keep the old one."""
        keygen = self._keygen(Path(self._host(host).dir) / "ssh_host_ed25519_key", overwrite=True)
        if keygen.returncode != 0:
            raise ClusterError(f"{host}: ssh-keygen failed: {keygen.stderr.read() if keygen.stderr else ''}")
        self.start_sshd(host)

    def close(self) -> None:
        """Remove everything the cluster created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        pids = [p.pid for p in self._sshd.values()]
        if self._state is not None:
            _teardown(self._state, pids)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        for proc in self._sshd.values():
            with contextlib.suppress(Exception):
                proc.wait(1)  # reap, so no zombie or ResourceWarning remains

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def prefix_len(self) -> int:
        return 24 if len(self._hosts) <= HOSTS_PER_24 else 23

    def __repr__(self) -> str:
        net = f"{SUBNET_PREFIX}.{self.subnet}.0/{self.prefix_len}"
        return f"Cluster(id={self.id}, hosts={len(self._hosts)}, subnet={net})"

    def _host(self, host: str) -> SimHost:
        try:
            return self._hosts[host]
        except KeyError:
            raise KeyError(f"no host {host!r} in {self!r}") from None

    def _build(self, names: Sequence[str], etc_hosts: bool) -> None:
        started = time.monotonic()
        for i, name in enumerate(names, start=1):
            hdir = self.workdir / name
            hdir.mkdir()
            self._hosts[name] = SimHost(
                name=name,
                index=i,
                addr="",
                netns=f"dr{self.id}-{name}",
                veth=f"drv{self.id}{name}",
                dir=str(hdir),
            )
        # Key generation forks one ssh-keygen per key; running them concurrently with the network set-up below
        # hides most of that cost.
        keygens = []
        if self.sshd:
            keygens.append(self._keygen(self.key_path, wait=False))
            keygens += [
                self._keygen(Path(h.dir) / "ssh_host_ed25519_key", wait=False) for h in self._hosts.values()
            ]

        with _locked():
            used = _used_subnets()
            width = 1 if len(names) <= HOSTS_PER_24 else 2
            free = [x for x in range(0, 256, width) if not used.intersection(range(x, x + width))]
            if width > 1:
                # From the top: a builder that knows only /24s takes the lowest free one and cannot see that
                # X+1 is part of this cluster's /23.
                free.reverse()
            if not free:
                raise ClusterError(f"no free 198.18.X.0/{self.prefix_len} subnet for a test cluster")
            self.subnet = free[0]
            self._hosts = {
                n: SimHost(**{**asdict(h), "addr": self._host_addr(h.index)}) for n, h in self._hosts.items()
            }
            self._state = _State(
                cluster_id=self.id,
                owner_pid=os.getpid(),
                subnet=self.subnet,
                bridge=f"drbr{self.id}",
                netns=tuple(h.netns for h in self._hosts.values()),
                veths=tuple(h.veth for h in self._hosts.values()),
                workdir=str(self.workdir),
                etc_hosts=etc_hosts,
                width=width,
            )
            # Recorded before anything exists so a crash at any later point is still cleaned up.
            (STATE_DIR / f"{self.id}.json").write_text(json.dumps(asdict(self._state)))
            self._create_network()

        self._write_files(etc_hosts)
        for proc in keygens:
            if proc.wait() != 0:
                raise ClusterError(f"ssh-keygen failed: {proc.stderr.read() if proc.stderr else ''}")
        if self.sshd:
            self._write_key_files()
            for host in self._hosts.values():
                self._spawn_sshd(host)
            self._wait_ready(names)
        log.info("%r up in %.2fs", self, time.monotonic() - started)

    def _host_addr(self, index: int) -> str:
        offset = 10 + index
        return f"{SUBNET_PREFIX}.{self.subnet + offset // 256}.{offset % 256}"

    def _create_network(self) -> None:
        assert self._state is not None
        bridge, guard = self._state.bridge, self._state.guard
        cmds = [
            f"link add {bridge} type bridge",
            f"addr add {self.bridge_addr}/{self.prefix_len} dev {bridge}",
            f"link set {bridge} up",
            # Anything the hosts send that is not for this machine is dropped here rather than forwarded.
            f"route add unreachable default table {guard}",
            f"rule add iif {bridge} pref {guard} table {guard}",
        ]
        for h in self._hosts.values():
            cmds += [
                f"netns add {h.netns}",
                f"link add {h.veth} type veth peer name eth0 address {_mac(h.addr)} netns {h.netns}",
                f"link set {h.veth} master {bridge}",
                f"link set {h.veth} up",
            ]
        _ip_batch(cmds)

        def configure(h: SimHost) -> None:
            _ip_batch(
                [
                    "link set lo up",
                    f"addr add {h.addr}/{self.prefix_len} dev eth0",
                    "link set eth0 up",
                    f"route add default via {self.bridge_addr}",
                    *(
                        f"neigh replace {peer.addr} lladdr {_mac(peer.addr)} dev eth0 nud permanent"
                        for peer in self._hosts.values()
                        if peer is not h
                    ),
                ],
                netns=h.netns,
            )

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(configure, self._hosts.values()))

    def _keygen(self, path: Path, *, wait: bool = True, overwrite: bool = False) -> subprocess.Popen[str]:
        if overwrite:
            path.unlink(missing_ok=True)
            path.with_suffix(".pub").unlink(missing_ok=True)
        proc = subprocess.Popen(
            [
                SSH_KEYGEN,
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"distrun-cluster-{self.id}",
                "-f",
                str(path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if wait:
            proc.wait()
        return proc

    def _write_files(self, etc_hosts: bool) -> None:
        host_lines = [f"{h.addr}\t{h.name}" for h in self._hosts.values()]
        hosts_file = "\n".join(
            [
                "127.0.0.1\tlocalhost",
                "::1\tlocalhost ip6-localhost ip6-loopback",
                f"{self.bridge_addr}\tlauncher",
                *host_lines,
                "",
            ]
        )
        # No nameserver, and nsswitch consults only the hosts file: a name that is not a test host fails at
        # once, and no lookup can ever leave the machine.
        resolv = f"# distrun test cluster {self.id}: no DNS\noptions timeout:1 attempts:1\n"
        nsswitch = _files_only_nsswitch()
        for h in self._hosts.values():
            ns_dir = ETC_NETNS / h.netns
            ns_dir.mkdir(parents=True, exist_ok=True)
            (ns_dir / "hosts").write_text(hosts_file)
            (ns_dir / "resolv.conf").write_text(resolv)
            (ns_dir / "nsswitch.conf").write_text(nsswitch)
        launcher_etc = self.workdir / "launcher-etc"
        launcher_etc.mkdir()
        own_hosts = ETC_HOSTS.read_text() if ETC_HOSTS.exists() else ""
        (launcher_etc / "hosts").write_text(own_hosts.rstrip("\n") + "\n" + "\n".join(host_lines) + "\n")
        (launcher_etc / "resolv.conf").write_text(resolv)
        (launcher_etc / "nsswitch.conf").write_text(nsswitch)
        if etc_hosts:
            marker = f"# distrun-cluster {self.id}"
            with _locked(), open(ETC_HOSTS, "a") as f:
                f.writelines(f"{line}\t{marker}\n" for line in host_lines)

        names = " ".join(self._hosts)
        blocks = [f"Host {h.name}\n    HostName {h.addr}\n" for h in self._hosts.values()]
        assert self._state is not None
        patterns = " ".join(f"{SUBNET_PREFIX}.{x}.*" for x in self._state.subnets)
        common = (
            f"Host {names} {patterns}\n"
            "    User root\n"
            "    Port 22\n"
            f"    IdentityFile {self.key_path}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts_path}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    CheckHostIP no\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 5\n"
            "    LogLevel ERROR\n"
        )
        self.ssh_config_path.write_text("\n".join([*blocks, common]))

        for h in self._hosts.values():
            lines = [
                f"ListenAddress {h.addr}",
                "Port 22",
                f"HostKey {h.dir}/ssh_host_ed25519_key",
                f"PidFile {h.dir}/sshd.pid",
                f"AuthorizedKeysFile {self.workdir}/authorized_keys",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "StrictModes no",
                "UseDNS no",
                "X11Forwarding no",
                "PrintMotd no",
                "PrintLastLog no",
                "LogLevel INFO",
                # sshd's built-in session PATH lacks pyenv/venv interpreters; real clusters share them.
                f"SetEnv PATH={self.session_path}",
            ]
            if self.max_startups is not None:
                lines.append(f"MaxStartups {self.max_startups}")
            (Path(h.dir) / "sshd_config").write_text("\n".join(lines) + "\n")

    def _write_key_files(self) -> None:
        pub = self.key_path.with_suffix(".pub").read_text()
        (self.workdir / "authorized_keys").write_text(pub)
        known = "".join(f"{h.name},{h.addr} {self.host_key(h.name)}\n" for h in self._hosts.values())
        self.known_hosts_path.write_text(known)
        dot_ssh = self.home / ".ssh"
        dot_ssh.mkdir(parents=True, mode=0o700)
        shutil.copy(self.ssh_config_path, dot_ssh / "config")
        shutil.copy(self.known_hosts_path, dot_ssh / "known_hosts")
        shutil.copy(self.key_path, dot_ssh / "id_ed25519")
        shutil.copy(self.key_path.with_suffix(".pub"), dot_ssh / "id_ed25519.pub")
        (dot_ssh / "id_ed25519").chmod(0o600)
        # ~/.ssh/config must point at ~/.ssh's own files, so that editing either copy behaves as users expect.
        config = (dot_ssh / "config").read_text()
        config = config.replace(str(self.known_hosts_path), str(dot_ssh / "known_hosts"))
        (dot_ssh / "config").write_text(config.replace(str(self.key_path), str(dot_ssh / "id_ed25519")))

    def _spawn_sshd(self, h: SimHost) -> None:
        # sshd refuses to start without its privilege-separation directory; Debian creates it only at boot.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        inner = f"hostname {h.name} && exec {SSHD} -D -e -f {h.dir}/sshd_config"
        bashrc = Path("~root/.bashrc").expanduser()
        if not self.login_rc and bashrc.is_file():
            empty = self.workdir / "empty-bashrc"
            empty.touch()
            # `ip netns exec` runs this in a mount namespace of its own: only this host sees the mount.
            inner = f"mount --bind {empty} {bashrc} && {inner}"
        with open(Path(h.dir) / "sshd.log", "ab") as logf:
            self._sshd[h.name] = subprocess.Popen(
                ["ip", "netns", "exec", h.netns, "unshare", "--uts", "sh", "-c", inner],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                # Own session: a Ctrl-C aimed at the test run must not kill sshd before teardown does.
                start_new_session=True,
            )

    def _wait_ready(self, names: Sequence[str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        for name in names:
            h = self._host(name)
            while True:
                proc = self._sshd[name]
                if proc.poll() is not None:
                    log_text = (Path(h.dir) / "sshd.log").read_text(errors="replace").strip()
                    raise ClusterError(f"{name}: sshd exited with {proc.returncode}: {log_text[-2000:]}")
                if self._banner(h.addr):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name}: sshd did not answer on {h.addr}:22 within {READY_TIMEOUT}s")
                time.sleep(0.02)
        # Each probe left an sshd child that exits a moment later; a fresh host must look clean.
        for name in names:
            listener = psutil.Process(self._sshd[name].pid)
            while listener.children() and time.monotonic() < deadline:
                time.sleep(0.01)

    @staticmethod
    def _banner(addr: str) -> bool:
        try:
            with socket.create_connection((addr, 22), timeout=1.0) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False


def _bench(sizes: Sequence[int], repeat: int) -> None:
    for n in sizes:
        for _ in range(repeat):
            t0 = time.monotonic()
            cluster = Cluster(n)
            t1 = time.monotonic()
            cluster.close()
            t2 = time.monotonic()
            print(f"{n:3d} hosts: up {t1 - t0:6.2f}s  down {t2 - t1:6.2f}s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.multihost.cluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cleanup", help="tear down clusters whose owning process died")
    bench = sub.add_parser("bench", help="time cluster set-up and teardown")
    bench.add_argument("sizes", nargs="*", type=int, default=[4, 16, 32])
    bench.add_argument("--repeat", type=int, default=1)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C (for manual testing)")
    up.add_argument("hosts", type=int, nargs="?", default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "cleanup":
        removed = cleanup_stale()
        log.info("removed %d stale cluster(s) %s", len(removed), " ".join(removed))
    elif args.cmd == "bench":
        _bench(args.sizes, args.repeat)
    else:
        with Cluster(args.hosts) as cluster:
            log.info(
                "ssh -F %s h1 hostname   |   HOME=%s distrun -H h1 ...", cluster.ssh_config_path, cluster.home
            )
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
