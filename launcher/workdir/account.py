"""What `--workdir` did, in words and in the report: the scan at launch, each sync's line, the report's
`workdir` object."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.core.command import script_of
from launcher.core.plan import plural
from launcher.errors import CommandNotFound
from launcher.workdir.files import Workdir, missing_script, scan
from launcher.workdir.sync import HostCopy

log = logging.getLogger(__name__)


def scan_for_launch(root: Path, limit: int, command: Sequence[str]) -> Workdir:
    """The tree to sync, before connecting anywhere: one too big, or without the job's script, is refused."""
    workdir = scan(root, limit)
    for line in workdir.skipped:
        log.warning("--workdir %s", line)
    script = script_of(command)
    if missing_script(workdir, script):
        raise CommandNotFound(f"{script} is not among the files of --workdir {workdir.root}")
    return workdir


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
