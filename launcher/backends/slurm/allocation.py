"""The Slurm allocation distrun runs in, read from the environment, and the `srun` command line that starts
an agent on one of its nodes (pure: no Slurm command is run here).

Inside `salloc`/`sbatch` Slurm describes the allocation in variables: `SLURM_JOB_NODELIST` in hostlist syntax
(`gpu[01-04,07],cpu-a[1-2]`), `SLURM_TASKS_PER_NODE` as run-length counts (`2(x3),1`) in the same node order,
and `SLURM_NTASKS` when the user asked for a task count.

The hostlist parser is our own, not python-hostlist: the grammar Slurm writes is small, the launcher keeps
to four runtime dependencies, and python-hostlist is GPL-2.0-or-later while distrun is Apache-2.0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from launcher.core.hosts import Host, is_host_name
from launcher.core.plan import plural
from launcher.errors import SlurmEnvError

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
NTASKS = "SLURM_NTASKS"

# Slurm refuses larger ranges too (hostlist.c's MAX_RANGE); it also keeps a typo from building a huge list.
MAX_RANGE = 1 << 16
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?\Z")
_COUNT_RE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?\Z")
_NUMBER_RE = re.compile(r"[0-9]+\Z")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Allocation:
    """The hosts of a Slurm job with their task slots, and the task count the user asked for, if any."""

    job_id: str
    hosts: tuple[Host, ...]
    num_tasks: int | None


def _split_top_level(text: str) -> list[str]:
    """Split on commas and blanks outside brackets: `a[1,3],b` is two entries."""
    entries: list[str] = []
    depth, start = 0, 0
    for at, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError("nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError("']' without '['")
            depth = 0
        elif not depth and (char == "," or char.isspace()):
            entries.append(text[start:at])
            start = at + 1
    if depth:
        raise ValueError("missing ']'")
    entries.append(text[start:])
    return [entry for entry in entries if entry]


def _numbers(ranges: str) -> Iterator[str]:
    """`01-03,7` -> 01 02 03 7: each range keeps the zero padding of its lower bound, as Slurm does."""
    for part in ranges.split(","):
        match = _RANGE_RE.match(part)
        if match is None:
            raise ValueError(f"bad range {part!r} (expected N or N-M)")
        low_text, high_text = match.groups()
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise ValueError(f"range {part!r} runs backwards")
        if high - low >= MAX_RANGE:
            raise ValueError(f"range {part!r} has more than {MAX_RANGE} hosts")
        width = len(low_text)
        yield from (str(number).zfill(width) for number in range(low, high + 1))


def _expand(entry: str) -> Iterator[str]:
    """Bracket groups multiply out, the first outermost: `r[1-2]-n[1-2]` -> r1-n1 r1-n2 r2-n1 r2-n2."""
    open_at = entry.find("[")
    if open_at < 0:
        yield entry
        return
    close_at = entry.index("]", open_at)
    prefix, ranges, rest = entry[:open_at], entry[open_at + 1 : close_at], entry[close_at + 1 :]
    tails = list(_expand(rest))
    for number in _numbers(ranges):
        yield from (prefix + number + tail for tail in tails)


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm hostlist syntax to host names in order; ValueError says what is wrong."""
    names: list[str] = []
    seen: set[str] = set()
    for entry in _split_top_level(text):
        for name in _expand(entry):
            if not is_host_name(name):
                raise ValueError(f"bad host name {name!r}")
            if name in seen:
                raise ValueError(f"host {name!r} is listed twice")
            seen.add(name)
            names.append(name)
    if not names:
        raise ValueError("no hosts")
    return tuple(names)


def expand_counts(text: str) -> tuple[int, ...]:
    """Slurm's per-node counts, `2(x3),1` -> 2 2 2 1; ValueError says what is wrong."""
    counts: list[int] = []
    for part in text.split(","):
        match = _COUNT_RE.match(part.strip())
        if match is None:
            raise ValueError(f"bad count {part!r} (expected N or N(xR))")
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if count == 0 or repeat == 0:
            raise ValueError(f"count {part!r} is zero")
        if repeat > MAX_RANGE:
            raise ValueError(f"count {part!r} repeats more than {MAX_RANGE} times")
        counts.extend([count] * repeat)
    return tuple(counts)


def _positive_count(text: str) -> int:
    if not (_NUMBER_RE.match(text) and int(text) > 0):
        raise ValueError("expected a positive integer")
    return int(text)


def _read(env: Mapping[str, str], name: str, parse: Callable[[str], _T]) -> _T | None:
    """`parse` of variable `name`, None when it is unset; a bad value is one line naming the variable."""
    value = env.get(name)
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as err:
        raise SlurmEnvError(f"{name}={value!r}: {err}") from None


def allocation_from_env(env: Mapping[str, str]) -> Allocation | None:
    """The allocation described by `env`, or None outside Slurm (no `SLURM_JOB_ID`).

    Without `SLURM_TASKS_PER_NODE` every node gets one slot; without `SLURM_NTASKS` the task count is open.
    """
    job_id = env.get(JOB_ID)
    if not job_id:
        return None
    names = _read(env, NODELIST, expand_hostlist)
    if names is None:
        raise SlurmEnvError(f"{JOB_ID}={job_id} is set but {NODELIST} is not: cannot tell the job's hosts")
    slots = _read(env, TASKS_PER_NODE, expand_counts) or (1,) * len(names)
    if len(slots) != len(names):
        raise SlurmEnvError(
            f"{TASKS_PER_NODE}={env[TASKS_PER_NODE]!r} gives "
            f"{plural(len(slots), 'task count', 'task counts')} "
            f"for the {plural(len(names), 'host', 'hosts')} of {NODELIST}={env[NODELIST]!r}"
        )
    origin = f"{NODELIST} of Slurm job {job_id}"
    hosts = tuple(Host(name, slots=count, origin=origin) for name, count in zip(names, slots, strict=True))
    return Allocation(job_id=job_id, hosts=hosts, num_tasks=_read(env, NTASKS, _positive_count))


# What slurmstepd tells the task of a step about that step. For the agent's one-task step it is "task 0 of 1",
# which is false for every rank the agent starts, and libraries that prefer SLURM_* over torchrun's variables
# (Lightning reads SLURM_NTASKS and SLURM_PROCID) would make every rank rank 0 of 1. The job's own variables
# (SLURM_JOB_ID, SLURM_JOB_NODELIST, ...) stay.
STEP_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_GTIDS",
    "SLURM_TASK_PID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NNODES",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEPID",
    "SLURM_STEP_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_SRUN_COMM_HOST",
    "SLURM_SRUN_COMM_PORT",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_DISTRIBUTION",
    "SLURM_CPU_BIND",
    "SLURM_CPU_BIND_LIST",
    "SLURM_CPU_BIND_TYPE",
    "SLURM_CPU_BIND_VERBOSE",
    "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN",
)


def srun_step_argv(nodes: Sequence[str], command: Sequence[str]) -> list[str]:
    """One `srun` step of the current allocation running `command` once on each of `nodes`: every agent of
    the job in one step.

    `--overlap` lets the step share the CPUs the job's own steps hold (and gives it every non-GRES resource of
    the node, so a cgroup cpuset does not squeeze all ranks onto one core); `--unbuffered` keeps slurmstepd
    from holding output until a newline; the explicit task counts win over `SLURM_NTASKS*` that salloc/sbatch
    put in our environment; `--mpi=none`: the agent is no MPI program, so no PMI server is set up for it;
    `--input=all`: every task reads the same bootstrap on stdin; `--kill-on-bad-exit=0` and `--wait=0`: one
    task ending, even badly, ends no other, as a job that loses a node may go on without it. `env -u` drops
    the step's description (`STEP_VARIABLES`) before the agent, and so every rank, inherits it.
    """
    return [
        "srun",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--wait=0",
        "--input=all",
        "--cpu-bind=none",
        "--unbuffered",
        "--quiet",
        "--mpi=none",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "env",
        *(arg for name in STEP_VARIABLES for arg in ("-u", name)),
        *command,
    ]
