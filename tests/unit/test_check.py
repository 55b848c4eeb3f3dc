from __future__ import annotations

from typing import Any

import pytest

from launcher.check.verdict import HostCheck, findings, row, software_findings, table, verdict, workdir_line

GOOD: dict[str, Any] = {
    "hostname": "h1",
    "python": "/usr/bin/python3",
    "python_version": "3.11.7",
    "cwd_exists": True,
    "python_found": True,
    "gpu_count": 0,
    "disk_free": 50 << 30,
    "route_ifname": "eth0",
    "torch": {"version": "2.13.0", "cuda": None},
    "tcp_error": "",
    "tcp_port": 40000,
}


def judge(check: HostCheck) -> list[tuple[str, str, bool]]:
    found = findings(check, cwd="/work/job", rank0="h1", python_option=None, hosts_option="-H")
    return [(f.what, f.fix, f.fatal) for f in found]


def test_healthy_host_has_no_findings_and_a_full_row() -> None:
    check = HostCheck("h2", 2, login_s=0.31, host_key="known", probe=GOOD, clock_offset_s=0.004)
    assert judge(check) == []
    assert row(check) == (
        "h2", "ok", "0.31s", "h1", "3.11.7 /usr/bin/python3", "2.13.0 cpu",
        "0/2", "50.0 GiB", "+0.00s", "eth0", "ok",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("check", "what", "fix"),
    [
        (
            HostCheck("h2", 1, error="h2: authentication refused for user root", error_kind="auth"),
            "authentication refused",
            "distrun ssh-setup -H h2",
        ),
        (
            HostCheck(
                "h2",
                1,
                error="h2: connection refused by 1.2.3.4:22 (is sshd running?)",
                error_kind="unreachable",
            ),
            "connection refused",
            "check that h2 is up and sshd listens there (ssh h2 true)",
        ),
        (
            HostCheck("h2", 1, error="h2: authentication refused", error_kind="auth", user="alice"),
            "authentication refused",
            "distrun ssh-setup -H alice@h2",
        ),
        (
            HostCheck("h2", 1, error="h2: refused", error_kind="unreachable", user="alice"),
            "refused",
            "(ssh alice@h2 true)",
        ),
        (
            HostCheck(
                "h2",
                1,
                error="host h2: the distrun agent exited before answering: distrun: no Python interpreter "
                "found here (tried /nonexistent/python)",
                error_kind="python",
            ),
            "no Python interpreter found here (tried /nonexistent/python)",
            "install Python 3.7 or newer on h2 as python3, or give --python PATH",
        ),
        (
            HostCheck("h2", 1, probe={**GOOD, "cwd_exists": False}),
            "launch directory /work/job is missing",
            "create or mount /work/job on h2",
        ),
        (
            HostCheck(
                "h2", 1, probe={**GOOD, "torch": {"error": "ModuleNotFoundError: No module named 'torch'"}}
            ),
            "torch does not import with /usr/bin/python3",
            "pip install torch there, or point --python PATH",
        ),
        (
            HostCheck("h2", 1, probe={**GOOD, "tcp_error": "timed out"}),
            "cannot open a TCP connection to rank 0's host h1:40000 (timed out)",
            "check nftables/iptables",
        ),
    ],
)
def test_problems_come_with_their_fix(check: HostCheck, what: str, fix: str) -> None:
    (found,) = judge(check)
    assert what in found[0]
    assert fix in found[1]
    assert found[2] is True


def test_warnings_do_not_fail_the_verdict() -> None:
    check = HostCheck("h2", 4, probe={**GOOD, "gpu_count": 2, "disk_free": 1 << 20}, clock_offset_s=-7.5)
    found = findings(check, cwd="/w", rank0="h1", python_option=None, hosts_option="-H")
    assert [(f.what, f.fatal) for f in found] == [
        ("4 slots but 2 GPUs", False),
        ("only 0.0 GiB free in /w", False),
        ("clock is -7.5s off this machine", False),
    ]
    assert verdict([check], found) == "ready: the host passed (3 warnings)"


def test_verdict_names_failing_hosts_and_table_aligns() -> None:
    ok = HostCheck("h1", 1, login_s=0.2, probe=GOOD)
    bad = HostCheck("h10", 1, error="h10: unreachable", error_kind="unreachable")
    problems = findings(bad, cwd="/w", rank0="h1", python_option=None, hosts_option="-H")
    assert verdict([ok, bad], problems) == "NOT READY: 1 of 2 hosts have problems (h10)"
    lines = table([row(ok), row(bad)])
    assert lines[0].startswith("host  ssh   login")
    assert lines[2].startswith("h10   FAIL")
    assert lines[1].index("ok") == lines[2].index("FAIL") == lines[0].index("ssh"), "columns line up"


def test_one_machine_under_two_names_is_a_problem_of_the_second() -> None:
    from launcher.check.verdict import same_machines

    checks = [
        HostCheck("h1", 2, probe={**GOOD, "machine": "m/b/n/h1"}),
        HostCheck("h2", 1, probe={**GOOD, "machine": "m/b/n/h2"}),
        HostCheck("10.0.0.1", 1, probe={**GOOD, "machine": "m/b/n/h1"}),
        HostCheck("old-agent", 1, probe=GOOD),  # an agent that reports no identity is never a duplicate
    ]
    (found,) = same_machines(checks)
    assert (found.host, found.fatal) == ("10.0.0.1", True)
    assert found.what == "the same machine as h1 (one machine-id, boot and hostname)"
    assert found.fix == "list it once with both entries' slots (h1:3)"


def test_a_host_with_other_software_is_a_problem_unless_allowed() -> None:
    software = {"python": "3.11.7", "torch": "2.13.0", "cuda": "", "nccl": ""}
    checks = [
        HostCheck("h1", 1, probe={**GOOD, "software": software}),
        HostCheck("h2", 1, probe={**GOOD, "software": {**software, "torch": "2.12.0"}}),
        HostCheck("h3", 1, probe={**GOOD, "software": software}),
        HostCheck("h4", 1, error="unreachable"),
    ]
    (found,) = software_findings(checks, allow_mismatch=False)
    assert (found.host, found.what, found.fatal) == (
        "h2",
        "a different stack: torch 2.12.0, others 2.13.0",
        True,
    )
    assert [f.fatal for f in software_findings(checks, allow_mismatch=True)] == [False]


def test_workdir_line_names_the_hosts_that_hold_the_copy() -> None:
    checks = [
        HostCheck("h1", 1, probe={**GOOD, "workdir_cached": True}),
        HostCheck("h2", 1, probe={**GOOD, "workdir_cached": False}),
        HostCheck("h3", 1, error="unreachable"),
    ]
    assert workdir_line("ab" * 32, 3, 2 << 20, checks) == (
        "workdir abababababab (3 files, 2.0 MiB): cached on h1; to send to h2"
    )
    assert workdir_line("ab" * 32, 1, 0, checks[2:]).endswith(": no host answered")


def test_a_missing_interpreter_without_python_is_named_by_its_path() -> None:
    """Without --python the probe looks for this machine's interpreter: the line names it, never `None`."""
    import sys

    (found,) = judge(HostCheck("h2", 1, probe={**GOOD, "python_found": False}))
    assert (
        found[0]
        == f"interpreter {sys.executable} (this machine's interpreter, used without --python) not found"
    )
