"""What `--workdir` did, in words and in the report: the scan at launch, each sync's line, the report's
`workdir` object."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.core.command import script_of
from launcher.core.plan import plural
from launcher.errors import CommandNotFound
from launcher.workdir.files import (
    BIGGEST_SHOWN,
    GIT_RULES,
    IGNORE_FILE,
    Workdir,
    left_out_by,
    missing_script,
    scan,
)
from launcher.workdir.sync import HostCopy

log = logging.getLogger(__name__)


def scan_for_launch(root: Path, limit: int, command: Sequence[str]) -> Workdir:
    """The tree to sync, before connecting anywhere: one too big, or without the job's script, is refused."""
    workdir = scan(root, limit)
    for line in workdir.skipped:
        log.warning("--workdir %s", line)
    left = left_out_line(workdir)
    if left:
        log.warning("%s", left)
    script = script_of(command)
    if missing_script(workdir, script):
        raise CommandNotFound(f"{script} is not among the files of --workdir {workdir.root}")
    return workdir


# How a user gets files that git ignores into the copy: there is no option for it, as .gitignore is the
# project's own word on what belongs to it.
HOW_TO_SEND = (
    "have git track {what} (git add -f {path}: tracked files travel), "  # two parts: the line's length
    "or read {what} from a path every host has"
)

# Python's words for a missing file, as a rank's last stderr line says them (open(), pandas, numpy alike).
_NOT_FOUND = re.compile(r"FileNotFoundError: \[Errno \d+\] [^:]*: '([^']+)'")


def left_out_line(workdir: Workdir) -> str | None:
    """At launch: what git's ignore rules leave out of the copy, which the ranks will not find there."""
    left = workdir.left_out
    if left is None:
        return None
    shown = ", ".join(
        f"{path} ({plural(files, 'file', 'files')}, {size_text(size)})" if path.endswith("/") else path
        for path, files, size in left.entries[:BIGGEST_SHOWN]
    )
    if len(left.entries) > BIGGEST_SHOWN:
        shown += ", ..."
    counted = f"{left.files}+ files" if left.capped else plural(left.files, "file", "files")
    size = f"at least {size_text(left.size)}" if left.capped else size_text(left.size)
    them = "it" if left.files == 1 else "them"
    return (
        f"--workdir {workdir.root}: git's ignore rules (.gitignore) leave out {counted} ({size}) that the "
        f"ranks will not find in the copy: {shown}; to send {them}, "
        + HOW_TO_SEND.format(what=them, path=left.entries[0][0])
    )


def missing_file_lines(workdir: Workdir, rank: int, stderr_tail: Sequence[str]) -> list[str]:
    """A failed rank's FileNotFoundError for a file of DIR that the copy left out: said, with the rule."""
    for line in reversed(stderr_tail):
        found = _NOT_FOUND.search(line)
        if found is None:
            continue
        path = found.group(1)
        rule = left_out_by(workdir, path)
        if rule is None:
            return []
        fixes = {
            GIT_RULES: "to send it, " + HOW_TO_SEND.format(what="it", path=path),
            IGNORE_FILE: f"to send it, take it out of {IGNORE_FILE}",
        }
        fix = fixes.get(rule, "distrun never sends those; read it from a path every host has")
        return [
            f"rank {rank} did not find {path}: --workdir {workdir.root} has it, but {rule} left it out of "
            f"the copy the ranks run in; {fix}"
        ]
    return []


def size_text(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size / 1024:.1f} KiB"


def log_sync(workdir: Workdir, copies: Mapping[str, HostCopy]) -> None:
    """One line per sync: the tree, what went out directly and what peers fed."""
    direct = [c for c in copies.values() if c.files_sent and c.fed_by is None]
    relayed = [c for c in copies.values() if c.fed_by is not None]
    log.info(
        "workdir %s (%s, %s): sent %s to %s%s", workdir.manifest_hash[:12],
        plural(len(workdir.files), "file", "files"), size_text(workdir.total),
        size_text(sum(c.bytes_sent for c in copies.values())), plural(len(direct), "host", "hosts"),
        f"; {plural(len(relayed), 'host', 'hosts')} fed by peers "
        f"({size_text(sum(c.bytes_from_peers for c in relayed))})" if relayed else "",
    )  # fmt: skip


def workdir_record(workdir: Workdir, synced: Mapping[str, Sequence[HostCopy]]) -> dict[str, object]:
    """The report's `workdir`: the copy, and what every sync (restarts included) sent to each host."""
    hosts = {
        name: {
            "files_sent": sum(c.files_sent for c in copies),
            "bytes_sent": sum(c.bytes_sent for c in copies),
            "bytes_from_peers": sum(c.bytes_from_peers for c in copies),
            "fed_by": sorted({c.fed_by for c in copies if c.fed_by is not None}),
        }
        for name, copies in synced.items()
    }
    return {
        "root": str(workdir.root),
        "manifest_hash": workdir.manifest_hash,
        "files": len(workdir.files),
        "bytes": workdir.total,
        "bytes_sent": sum(c.bytes_sent for copies in synced.values() for c in copies),
        "hosts": hosts,
    }
