"""Every process a rank started, however it detached, belongs to the agent: it is stopped with the job.

A rank's process group holds its ordinary children (DataLoader workers), but a child started with
`start_new_session=True`, a double-forked `setsid` daemon or a `process_group=0` child leaves that group. The
agent makes itself a child subreaper (Linux's PR_SET_CHILD_SUBREAPER): whatever its ranks leave orphaned is
re-parented to the agent instead of to init, so every such process stays a descendant of the agent, where
`descendants()` finds it and the agent can signal and reap it.

Why a subreaper and not a cgroup: it needs no privileges and no cgroup delegation, so it works the same for
the local agent, over a plain SSH login (no systemd user scope) and inside a Slurm step (whose cgroup
slurmstepd owns). Its limit: an agent killed outright (SIGKILL) cannot stop them; its ranks still die with it
(PR_SET_PDEATHSIG), but detached processes are re-parented further up.

Stdlib-only and Python 3.7 compatible: it is shipped to remote hosts with the agent.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Set

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children; False where the system cannot."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int | str) -> tuple[int, bytes] | None:
    """A process's parent and state letter (Z: zombie) from /proc/PID/stat; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name in parentheses may contain anything, spaces and ")" included: split after the last.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return (int(fields[1]), fields[0]) if len(fields) > 1 else None


def _processes() -> dict[int, tuple[int, bytes]]:
    """Every visible process's parent and state letter, from /proc (empty without /proc)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    found = {}
    for name in names:
        stat = _stat(name) if name.isdigit() else None
        if stat is not None:
            found[int(name)] = stat
    return found


def _children(pid: int) -> list[int] | None:
    """`pid`'s children from /proc/PID/task/*/children; None where the kernel does not offer that file."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                found.extend(int(child) for child in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return found


def _zombie(pid: int) -> bool:
    stat = _stat(pid)
    return stat is None or stat[1] == b"Z"  # gone: as good as a zombie for whoever asks


def descendants(root: int = 0, *, zombies: bool = False) -> list[int]:
    """The pids below `root` (this process by default), parents before children.

    A zombie is left out unless `zombies`: its own children were re-parented already, and only its parent's
    wait removes it. Only the subtree is read where the kernel lists each task's children; else every
    process's parent.
    """
    root = root or os.getpid()
    found: list[int] = []
    todo = [root]
    while todo:
        children = _children(todo.pop())
        if children is None:
            return _descendants_by_scan(root, zombies)
        for child in children:
            if zombies or not _zombie(child):
                found.append(child)
                todo.append(child)
    return found


def _descendants_by_scan(root: int, zombies: bool) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, state) in _processes().items():
        if zombies or state != b"Z":
            children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def signal_descendants(sig: int, skip_groups: Set[int] = frozenset()) -> None:
    """Send `sig` to every living descendant of this process but those in `skip_groups`.

    The skipped groups are those the caller has just signalled as a whole: a process must get one signal,
    not two. Python runs a handler once per delivery, so a rank's SIGTERM or Ctrl-C handler that is still
    running when the second copy lands runs again (a checkpoint written twice, cleanup interrupted)."""
    for pid in descendants():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) not in skip_groups:
                os.kill(pid, sig)


def reap_adopted(keep: Set[int]) -> None:
    """Reap the exited children of this process but `keep` (its ranks, which it reaps itself for their exit
    status and usage): the processes it adopted as their subreaper, which nobody else waits for.

    A peek (WNOWAIT) first, so that the common case, no exited child at all, costs one system call and no
    walk through /proc.
    """
    while True:
        try:
            peeked = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, AttributeError):  # no children; no waitid (not Linux)
            return
        if peeked is None:
            return
        if peeked.si_pid in keep:
            break  # a rank that exited just now is first in line: look past it below
        with contextlib.suppress(ChildProcessError):
            os.waitpid(peeked.si_pid, 0)
    me = os.getpid()
    for pid, (parent, state) in _processes().items():
        if parent == me and state == b"Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
