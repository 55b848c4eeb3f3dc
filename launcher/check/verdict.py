"""`distrun check`: is every host ready for a launch? A row per host, a verdict, a fix per problem (pure).

The side effects (connecting, probing) live in launcher/check/run.py; this module judges what they found.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.core.plan import plural
from launcher.core.same_software import differences

# Below this much free space in the launch directory, checkpoints and logs are likely to fail mid-run.
MIN_FREE_BYTES = 1 << 30
# Clocks further apart than this make logs of different hosts hard to line up and can upset TLS/Kerberos.
MAX_CLOCK_OFFSET = 2.0


@dataclass(frozen=True)
class HostCheck:
    """What checking one host found. `error` set: it could not be reached (or its agent did not answer).

    `error_kind`: `auth` (no key accepted), `host-key` (changed key), `unreachable`, `python` (no interpreter
    to run the agent), or `other`. `probe` is the agent's answer (launcher.agent.protocol Facts as a dict
    plus the
    check fields). `user`: the login named in `-H user@host`, which fixes must name too.
    """

    host: str
    slots: int
    login_s: float | None = None
    host_key: str | None = None  # known, recorded (accept-new), unchecked (ignore), local
    error: str | None = None
    error_kind: str | None = None
    probe: dict[str, Any] | None = None
    clock_offset_s: float | None = None
    user: str | None = None


@dataclass(frozen=True)
class Finding:
    """A problem (fails the check) or a warning, with the one-line fix."""

    host: str
    what: str
    fix: str
    fatal: bool = True


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.1f} GiB"


def findings(
    check: HostCheck, *, cwd: str, rank0: str, python_option: str | None, hosts_option: str
) -> list[Finding]:
    """Every problem of one host, each with its fix."""
    host = check.host
    login = shlex.quote(f"{check.user}@{host}" if check.user else host)
    if check.error is not None:
        if check.error_kind == "auth":
            fix = f"distrun ssh-setup -H {login}"
        elif check.error_kind == "host-key":
            fix = "if the host was reinstalled, remove the old key with the ssh-keygen -R command above"
        elif check.error_kind == "unreachable":
            fix = f"check that {host} is up and sshd listens there (ssh {login} true)"
        elif check.error_kind == "python":
            fix = (
                f"give --python the path of a Python 3.7 or newer on {host}"
                if python_option
                else f"install Python 3.7 or newer on {host} as python3, or give --python PATH"
            )
        else:
            fix = f"see what `ssh {login} true` says; -vv shows distrun's SSH details"
        return [Finding(host, check.error, fix)]
    probe = check.probe or {}
    found: list[Finding] = []
    if not probe.get("cwd_exists", True):
        found.append(
            Finding(
                host, f"launch directory {cwd} is missing", f"create or mount {cwd} on {host} (same path)"
            )
        )
    if not probe.get("python_found", True):
        # Without --python the probe looked for this machine's interpreter, by its path.
        wanted = python_option or f"{sys.executable} (this machine's interpreter, used without --python)"
        found.append(
            Finding(host, f"interpreter {wanted} not found", "install it there or give --python PATH")
        )
    torch = probe.get("torch") or {}
    if torch.get("error"):
        option = f"--python {python_option}" if python_option else "--python PATH"
        found.append(
            Finding(
                host,
                f"torch does not import with {probe.get('python', 'python')}: {torch['error']}",
                f"pip install torch there, or point {option} at an interpreter that has it",
            )
        )
    gpus = int(probe.get("gpu_count", 0))
    if gpus and check.slots > gpus:
        found.append(
            Finding(
                host,
                f"{plural(check.slots, 'slot', 'slots')} but {plural(gpus, 'GPU', 'GPUs')}",
                f"give it at most {plural(gpus, 'slot', 'slots')} ({hosts_option} {host}:{gpus}) "
                "so no two ranks share a GPU",
                fatal=False,
            )
        )
    free = probe.get("disk_free")
    if free is not None and int(free) < MIN_FREE_BYTES:
        found.append(
            Finding(host, f"only {_gib(int(free))} free in {cwd}", "free some space there", fatal=False)
        )
    if check.clock_offset_s is not None and abs(check.clock_offset_s) > MAX_CLOCK_OFFSET:
        found.append(
            Finding(
                host,
                f"clock is {check.clock_offset_s:+.1f}s off this machine",
                "synchronise clocks (chrony or systemd-timesyncd)",
                fatal=False,
            )
        )
    tcp = probe.get("tcp_error")
    if tcp:
        port = probe.get("tcp_port", "")
        found.append(
            Finding(
                host,
                f"cannot open a TCP connection to rank 0's host {rank0}:{port} ({tcp})",
                f"allow TCP from {host} to {rank0} (rendezvous and NCCL/gloo ports): check nftables/iptables"
                " and security groups on both hosts",
            )
        )
    return found


def software_findings(checks: Sequence[HostCheck], allow_mismatch: bool) -> list[Finding]:
    """A host whose Python, torch, CUDA or NCCL differ from the others' (a problem, as at launch, unless
    --allow-mismatch)."""
    reports = [(c.host, (c.probe or {}).get("software") or {}) for c in checks if c.error is None and c.probe]
    found = []
    for line in differences(reports):
        host, what = line.split(": ", 1)
        fix = "install the same versions on every host, or point --python at an interpreter that has them"
        found.append(Finding(host, f"a different stack: {what}", fix, fatal=not allow_mismatch))
    return found


def workdir_line(mhash: str, files: int, size: int, checks: Sequence[HostCheck]) -> str:
    """Which hosts already hold the --workdir copy a launch would run (the others get what they lack)."""
    cached = [c.host for c in checks if (c.probe or {}).get("workdir_cached")]
    missing = [c.host for c in checks if c.probe is not None and not c.probe.get("workdir_cached")]
    parts = [
        f"cached on {', '.join(cached)}" if cached else "",
        f"to send to {', '.join(missing)}" if missing else "",
    ]
    where = "; ".join(p for p in parts if p) or "no host answered"
    return f"workdir {mhash[:12]} ({plural(files, 'file', 'files')}, {size / (1 << 20):.1f} MiB): {where}"


def row(check: HostCheck) -> tuple[str, ...]:
    """The cells of one host's row, in HEADER's order."""
    if check.error is not None or check.probe is None:
        return (check.host, "FAIL", "-", "-", "-", "-", "-", "-", "-", "-", "-")
    probe = check.probe
    torch = probe.get("torch") or {}
    if torch.get("error"):
        torch_text = "missing"
    elif torch:
        torch_text = f"{torch.get('version')} " + (f"CUDA {torch['cuda']}" if torch.get("cuda") else "cpu")
        nccl = (probe.get("software") or {}).get("nccl")
        torch_text += f" NCCL {nccl}" if nccl else ""
    else:
        torch_text = "-"
    free = probe.get("disk_free")
    disk = "missing" if not probe.get("cwd_exists", True) else (_gib(int(free)) if free is not None else "-")
    clock = "-" if check.clock_offset_s is None else f"{check.clock_offset_s:+.2f}s"
    tcp_error = probe.get("tcp_error")
    tcp = "-" if tcp_error is None else ("ok" if tcp_error == "" else "blocked")
    return (
        check.host,
        "ok",
        "-" if check.login_s is None else f"{check.login_s:.2f}s",
        str(probe.get("hostname", "-")),
        f"{probe.get('python_version', '?')} {probe.get('python', '')}".strip(),
        torch_text,
        f"{probe.get('gpu_count', 0)}/{check.slots}",
        disk,
        clock,
        str(probe.get("route_ifname") or "-"),
        tcp,
    )


HEADER = (
    "host",
    "ssh",
    "login",
    "hostname",
    "python",
    "torch",
    "GPUs/slots",
    "free",
    "clock",
    "route",
    "tcp→rank 0",
)


def table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]


def same_machines(checks: Sequence[HostCheck]) -> list[Finding]:
    """A problem for each host that is a machine listed before it under another name (its agent reports the
    same machine identity): a launch refuses that, since both would share its GPUs and LOCAL_RANKs."""
    first: dict[str, HostCheck] = {}
    found = []
    for check in checks:
        identity = (check.probe or {}).get("machine") or ""
        if not identity:
            continue
        earlier = first.setdefault(identity, check)
        if earlier is not check:
            found.append(
                Finding(
                    check.host,
                    f"the same machine as {earlier.host} (one machine-id, boot and hostname)",
                    f"list it once with both entries' slots ({earlier.host}:{earlier.slots + check.slots})",
                )
            )
    return found


def verdict(checks: Sequence[HostCheck], problems: Sequence[Finding]) -> str:
    failing = sorted({f.host for f in problems if f.fatal})
    warnings = sum(not f.fatal for f in problems)
    if failing:
        return f"NOT READY: {len(failing)} of {len(checks)} hosts have problems ({', '.join(failing)})"
    note = f" ({plural(warnings, 'warning', 'warnings')})" if warnings else ""
    every = "the host" if len(checks) == 1 else f"all {len(checks)} hosts"
    return f"ready: {every} passed{note}"
