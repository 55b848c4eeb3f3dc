"""Where `--report` goes and how it is written: through a symlink and over a regular file as `>` would, whole.

A report replaces only a regular file (or creates one). A symlink is followed, so the link stays and its
target gets the report, as `distrun ... > link` would do. Anything else at the path (a FIFO, a device such as
/dev/full, a directory, a socket) is refused: replacing it would destroy what the user pointed at, and
writing into it would block or fail at the end of a long job.

For the same reason the start checks that the report's directory takes a file of a report's usual size: a
full file system found only after the run would cost the account of a job that may have run for days. A launch
then holds that room for the whole run (`ReportSlot`), and removes the earlier run's report as it starts: a
report under the name is always this run's, never one left from before that a failed write did not replace.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from launcher.errors import UsageError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


# What the start allocates to show a report fits, and a launch holds until its end: a small job's account (a
# large one's is tens of KiB; what the held room cannot take is still asked of the file system at the end).
PROBE_BYTES = 16 * 1024


class ReportPathError(UsageError):
    """`--report` names something that is not a regular file (or a symlink to one), or cannot be written."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def report_target(path: Path) -> Path:
    """The regular file the report will replace or create: `path`, or where its symlinks lead.

    ReportPathError (one line, naming `path`) when that is anything but a regular file, or its directory is
    missing or not writable.
    """
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:
        raise ReportPathError(f"--report {path}: {err.strerror or err}") from None
    if mode is not None and not stat.S_ISREG(mode):
        shown = f"{path}" if target == Path(os.path.abspath(path)) else f"{path} (-> {target})"
        raise ReportPathError(f"--report {shown}: is {_kind(mode)}, not a regular file; give a file name")
    if not target.parent.is_dir():
        raise ReportPathError(f"--report {path}: directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise ReportPathError(f"--report {path}: cannot write in {target.parent}")
    return target


def check_room(path: Path) -> None:
    """ReportPathError unless a file of PROBE_BYTES can be made beside the report's target (`path` as
    `report_target` accepts it): a full or read-only file system, or a spent quota, is said at the start.

    The space is allocated, not only asked about: free-block counts do not see quotas or reserved blocks,
    and a delayed-allocation file system takes a write it cannot keep. The trial file is removed at once.
    """
    target = report_target(path)
    trial = target.with_name(f".{target.name}.{os.getpid()}.check")
    try:
        fd = os.open(trial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise ReportPathError(
            f"--report {path}: cannot write in {target.parent}: {err.strerror or err}"
        ) from None
    try:
        _allocate(fd, PROBE_BYTES)
    except OSError as err:
        raise ReportPathError(
            f"--report {path}: {target.parent} has no room for the report: {err.strerror or err}"
        ) from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(trial)


def _allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # A file system without fallocate (some network ones): real bytes, flushed so they are really held.
        zeros = memoryview(bytes(size))
        while zeros:
            zeros = zeros[os.write(fd, zeros) :]
        os.fsync(fd)


def write_whole(path: Path, text: str) -> None:
    """Replace the report at `path` atomically: a reader sees the old file or the new one, never half.

    The temporary file sits beside the real target (so the rename stays on one file system), takes the old
    file's permission bits, and is removed again if anything fails. OSError (or ReportPathError) on failure.
    """
    target = report_target(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by an earlier distrun that had this pid and was killed while writing
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(fd, stat.S_IMODE(target.stat().st_mode))
            # Imported here: the CLI imports this module, and need not load the protocol (about 10 ms).
            from launcher.agent.protocol import write_all

            write_all(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class ReportSlot:
    """A launch's hold on its report's name, from its start to its end.

    Opening it allocates PROBE_BYTES in the temporary file the report is written into at the end, so a disk
    that fills during the run (with --output-dir's logs, say) still takes a small job's account; then it
    removes the earlier run's report, so that no failure from here on leaves that under the name as if it
    were this run's. `write` replaces the name atomically, `discard` gives the room back.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.target = report_target(path)
        self.tmp = self.target.with_name(f".{self.target.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)  # left by an earlier distrun that had this pid and was killed while writing
        try:
            mode = stat.S_IMODE(self.target.stat().st_mode)
        except FileNotFoundError:
            mode = None
        except OSError as err:
            raise ReportPathError(f"--report {path}: {err.strerror or err}") from None
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd: int | None = os.open(self.tmp, flags, 0o666)
        except OSError as err:
            raise ReportPathError(
                f"--report {path}: cannot write in {self.target.parent}: {err.strerror}"
            ) from None
        try:
            if mode is not None:
                os.fchmod(self.fd, mode)
            _allocate(self.fd, PROBE_BYTES)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.target)
        except OSError as err:
            self.discard()
            raise ReportPathError(
                f"--report {path}: {self.target.parent} has no room for the report: {err.strerror or err}"
            ) from None

    def write(self, text: str) -> None:
        """The report, under the name at once and whole; OSError (the name then stays free) on failure."""
        # Imported here: the CLI imports this module, and need not load the protocol (about 10 ms).
        from launcher.agent.protocol import write_all

        fd = self.fd
        if fd is None:
            raise OSError(errno.EBADF, "the report's file was already closed")
        try:
            data = text.encode("utf-8")
            os.lseek(fd, 0, os.SEEK_SET)
            write_all(fd, data)
            os.ftruncate(fd, len(data))
            self.fd = None
            os.close(fd)
            os.replace(self.tmp, self.target)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Close and remove the temporary file (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)
