"""Slurm's hostlist and task-count syntax, and the allocation read from the environment (pure)."""

from __future__ import annotations

import pytest

from launcher.backends.slurm.allocation import (
    Allocation,
    allocation_from_env,
    expand_counts,
    expand_hostlist,
    srun_step_argv,
)
from launcher.core.hosts import Host
from launcher.errors import EXIT_USAGE, SlurmEnvError


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("node7", ("node7",)),
        ("a,b,c", ("a", "b", "c")),
        ("a b\tc", ("a", "b", "c")),
        ("lx[10-12]", ("lx10", "lx11", "lx12")),
        ("tux[1,3-5]", ("tux1", "tux3", "tux4", "tux5")),
        ("linux[00-02]", ("linux00", "linux01", "linux02")),
        ("gpu[01-04,07],cpu-a[1-2]", ("gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1", "cpu-a2")),
        # The lower bound sets the width; numbers past it simply grow.
        ("n[8-11]", ("n8", "n9", "n10", "n11")),
        ("n[098-101]", ("n098", "n099", "n100", "n101")),
        ("n[007]", ("n007",)),
        ("[1-2]", ("1", "2")),
        ("node[1-2]-ib", ("node1-ib", "node2-ib")),
        ("rack[1-2]-n[01-02]", ("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")),
        ("rack[0-1]_blade[0-1]", ("rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1")),
        ("a[1-2]b[3]c[4-5]", ("a1b3c4", "a1b3c5", "a2b3c4", "a2b3c5")),
        ("x[1-2],y,z[3]", ("x1", "x2", "y", "z3")),
        ("g1.org,g[2-3].org", ("g1.org", "g2.org", "g3.org")),
        ("10.0.0.[1-2]", ("10.0.0.1", "10.0.0.2")),
    ],
)
def test_expand_hostlist(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(hostlist) == names


@pytest.mark.parametrize(
    ("hostlist", "problem"),
    [
        ("", "no hosts"),
        (",", "no hosts"),
        ("n[1-3", "missing ']'"),
        ("n1-3]", "']' without '['"),
        ("n[1[2]]", "nested '['"),
        ("n[3-1]", "runs backwards"),
        ("n[]", "bad range ''"),
        ("n[a-b]", "bad range 'a-b'"),
        ("n[1-]", "bad range '1-'"),
        ("n[1,,2]", "bad range ''"),
        ("n[0-70000]", "more than 65536 hosts"),
        ("n[1-2],n2", "'n2' is listed twice"),
        ("-n[1-2]", "bad host name '-n1'"),
        ("us@er", "bad host name 'us@er'"),
    ],
)
def test_bad_hostlist(hostlist: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        expand_hostlist(hostlist)


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("1", (1,)),
        ("4", (4,)),
        ("2(x3),1", (2, 2, 2, 1)),
        ("72(x2),36", (72, 72, 36)),
        ("1(x4)", (1, 1, 1, 1)),
        ("3,1(x2),2", (3, 1, 1, 2)),
    ],
)
def test_expand_counts(text: str, counts: tuple[int, ...]) -> None:
    assert expand_counts(text) == counts


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "bad count ''"),
        ("2(x3", "bad count '2\\(x3'"),
        ("2x3", "bad count '2x3'"),
        ("-1", "bad count '-1'"),
        ("0,2", "count '0' is zero"),
        ("2(x0)", "is zero"),
        ("1(x100000)", "repeats more than"),
    ],
)
def test_bad_counts(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        expand_counts(text)


def test_outside_slurm_there_is_no_allocation() -> None:
    assert allocation_from_env({}) is None
    assert allocation_from_env({"SLURM_JOB_NODELIST": "n[1-2]"}) is None


def test_allocation_from_env() -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "gpu[01-02],cpu-a1",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_NTASKS": "5",
    }
    origin = "SLURM_JOB_NODELIST of Slurm job 42"
    assert allocation_from_env(env) == Allocation(
        job_id="42",
        hosts=(
            Host("gpu01", 2, origin=origin),
            Host("gpu02", 2, origin=origin),
            Host("cpu-a1", 1, origin=origin),
        ),
        num_tasks=5,
    )


def test_allocation_without_task_counts_has_one_slot_per_node() -> None:
    allocation = allocation_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"})
    assert allocation is not None
    assert [(h.name, h.slots) for h in allocation.hosts] == [("n1", 1), ("n2", 1), ("n3", 1)]
    assert allocation.num_tasks is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SLURM_JOB_ID=9 is set but SLURM_JOB_NODELIST is not: cannot tell the job's hosts"),
        ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST='': no hosts"),
        ({"SLURM_JOB_NODELIST": "n[1-2"}, "SLURM_JOB_NODELIST='n[1-2': missing ']'"),
        (
            {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2"},
            "SLURM_TASKS_PER_NODE='2(x2': bad count '2(x2' (expected N or N(xR))",
        ),
        (
            {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
            "SLURM_TASKS_PER_NODE='2(x2)' gives 2 task counts for the 3 hosts of SLURM_JOB_NODELIST='n[1-3]'",
        ),
        (
            {"SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "two"},
            "SLURM_NTASKS='two': expected a positive integer",
        ),
        ({"SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "0"}, "SLURM_NTASKS='0': expected a positive integer"),
    ],
)
def test_bad_allocation_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SlurmEnvError) as info:
        allocation_from_env({"SLURM_JOB_ID": "9", **env})
    assert str(info.value) == message
    assert info.value.exit_code == EXIT_USAGE


def test_srun_step_runs_one_unbuffered_overlapping_task_on_each_node() -> None:
    argv = srun_step_argv(["node02", "node03"], ["python3", "-c", "pass"])
    assert argv[0] == "srun"
    assert argv[-3:] == ["python3", "-c", "pass"]
    options = argv[: argv.index("env")]
    assert "--nodelist=node02,node03" in options
    for option in ("--overlap", "--cpu-bind=none", "--unbuffered", "--nodes=2", "--ntasks=2", "--input=all"):
        assert option in options
    # A task that ends badly (a node lost mid-job) must not end the other nodes' agents.
    assert "--kill-on-bad-exit=0" in options
    assert argv.index("SLURM_PROCID") == argv.index("-u", argv.index("env")) + 1
