"""`--workdir DIR`: which files of DIR travel, and their manifest (what `launcher.agent.store` builds copies
from).

In a git work tree: the files git tracks or could track (`git ls-files --cached --others --exclude-standard`:
.gitignore honoured, .git itself never sent). Elsewhere: everything but DEFAULT_EXCLUDES. In both, the
patterns of DIR/.distrunignore (gitignore-like: `name`, `*.ext`, `dir/`, `/anchored/path`, `# comments`) leave
out more. Symlinks that stay inside DIR travel as symlinks; symlinks leaving it and files that cannot be read
are skipped, each named in one line. What git's ignore rules leave out (beyond what distrun never sends, and
.distrunignore) is counted, so that the launch can say so: a `data/` folder in .gitignore is a common
surprise. Nothing is sent when the total is above the limit, which the files'
sizes decide before any is read. Each file keeps its permission bits (the copy drops their write bits).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.agent.store import FILE, LINK, manifest_hash
from launcher.core.plan import plural
from launcher.errors import HostError, UsageError

DEFAULT_LIMIT = 200 << 20
IGNORE_FILE = ".distrunignore"
DEFAULT_EXCLUDES = (".git/", "__pycache__/", ".venv/", "venv/", "*.pyc", ".mypy_cache/", ".pytest_cache/")
BIGGEST_SHOWN = 5
# What left a file out, as messages name it (besides IGNORE_FILE).
GIT_RULES = "git's ignore rules"
DEFAULT_RULES = "distrun's default excludes"
# Counting what .gitignore leaves out stops here: a launch must not walk a huge ignored tree file by file.
LEFT_OUT_CAP = 10_000


@dataclass(frozen=True)
class WorkdirFile:
    """One entry of the copy: `target` set for a symlink (then `digest` is empty); `mode`: the permission
    bits."""

    path: str  # relative, with "/" separators
    size: int
    digest: str = ""
    mode: int = 0o644
    target: str | None = None

    def entry(self) -> list[object]:
        if self.target is not None:
            return [self.path, LINK, self.target, 0, False]
        return [self.path, FILE, self.digest, self.size, self.mode]


@dataclass(frozen=True)
class LeftOut:
    """What git's ignore rules left out of the copy, beyond what distrun never sends and .distrunignore:
    `files` and `size` in all (at least: `capped` when counting stopped at LEFT_OUT_CAP files), and the
    entries git named (a directory with a trailing "/"), biggest first, as (path, files, bytes)."""

    files: int
    size: int
    entries: tuple[tuple[str, int, int], ...]
    capped: bool = False


@dataclass(frozen=True)
class Workdir:
    """DIR's files as they will be copied: the manifest, its hash, what was skipped (one line each), and
    what git's ignore rules left out (None: not a git work tree, or nothing)."""

    root: Path
    files: tuple[WorkdirFile, ...]
    skipped: tuple[str, ...] = ()
    left_out: LeftOut | None = None

    @property
    def entries(self) -> list[list[object]]:
        return [f.entry() for f in self.files]

    @property
    def manifest_hash(self) -> str:
        return manifest_hash(self.entries)

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def by_digest(self) -> dict[str, WorkdirFile]:
        return {f.digest: f for f in self.files if f.target is None}


class WorkdirError(UsageError):
    """--workdir cannot be sent as it is (missing, too big): nothing was sent anywhere."""


class WorkdirChanged(WorkdirError, HostError):
    """A file of --workdir changed (or went away) between its hashing and its sending: bad input (exit 2),
    not a host's fault; no rank started. Also a HostError without a host, so that the sync's wait, which
    passes a sender's HostError on as it is, ends the launch with it and a restart never hides it."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(
            f"--workdir: {path} {what} while distrun was sending it, so hosts could get different"
            " versions of it; nothing ran. Launch again once it is saved (or leave it out in"
            f" {IGNORE_FILE})"
        )


def parse_ignore(lines: Iterable[str]) -> tuple[str, ...]:
    """The patterns of an ignore file, blank lines and comments dropped."""
    return tuple(s for line in lines if (s := line.strip()) and not s.startswith("#"))


def ignored(path: str, patterns: Sequence[str], is_dir: bool = False) -> bool:
    """Whether `path` (relative, "/"-separated) or a directory above it matches one of `patterns`.

    A pattern with a "/" before its end matches the path from DIR's top; one without matches any name
    along the path; a trailing "/" matches directories only.
    """
    parts = path.split("/")
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        bare = pattern.strip("/")
        anchored = "/" in pattern.rstrip("/")
        # Every directory above `path`, then `path` itself (a directory only if `is_dir`).
        for depth in range(1, len(parts) + 1):
            last = depth == len(parts)
            if dir_only and last and not is_dir:
                continue
            if anchored:
                if fnmatch.fnmatchcase("/".join(parts[:depth]), bare):
                    return True
            elif fnmatch.fnmatchcase(parts[depth - 1], bare):
                return True
    return False


def _git_ignored(root: Path) -> list[str]:
    """What git's ignore rules leave out under `root`: untracked ignored files, and directories ignored as a
    whole as one entry each ("data/"); [] where git does not answer."""
    try:
        done = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--others",
                "--ignored",
                "--exclude-standard",
                "--directory",
            ],
            capture_output=True,
            check=False,
        )
    except OSError:
        return []
    if done.returncode != 0:
        return []
    return sorted({p for p in done.stdout.decode(errors="surrogateescape").split("\0") if p})


def left_out(root: Path, own: Sequence[str]) -> LeftOut | None:
    """What git's ignore rules leave out of `root`'s copy that distrun would otherwise send: neither in
    DEFAULT_EXCLUDES (a virtual environment, caches) nor in .distrunignore (`own`)."""
    never = (*DEFAULT_EXCLUDES, *own)
    counted: list[tuple[str, int, int]] = []
    total = 0
    for entry in _git_ignored(root):
        if total >= LEFT_OUT_CAP:
            break
        is_dir = entry.endswith("/")
        if ignored(entry.rstrip("/"), never, is_dir=is_dir):
            continue
        files, size = _count(root, entry, never, LEFT_OUT_CAP - total) if is_dir else _size(root / entry)
        if files:
            counted.append((entry, files, size))
            total += files
    if not counted:
        return None
    biggest = tuple(sorted(counted, key=lambda e: (-e[2], e[0])))
    return LeftOut(total, sum(e[2] for e in counted), biggest, capped=total >= LEFT_OUT_CAP)


def _size(path: Path) -> tuple[int, int]:
    """One file, and its size; none for what is not a regular file (a socket, gone meanwhile)."""
    try:
        st = path.lstat()
    except OSError:
        return 0, 0
    return (1, st.st_size) if stat.S_ISREG(st.st_mode) else (0, 0)


def _count(root: Path, entry: str, never: Sequence[str], cap: int) -> tuple[int, int]:
    """The regular files under the directory `entry` that distrun would send, and their bytes, up to `cap`
    files."""
    files = size = 0
    for here, dirs, names in os.walk(root / entry):
        prefix = os.path.relpath(here, root).replace(os.sep, "/") + "/"
        dirs[:] = [d for d in dirs if not ignored(prefix + d, never, is_dir=True)]
        for name in names:
            if files >= cap:
                return files, size
            if not ignored(prefix + name, never):
                one, bytes_ = _size(Path(here) / name)
                files, size = files + one, size + bytes_
    return files, size


def _git_files(root: Path) -> list[str] | None:
    """What git tracks or could track under `root`, or None when `root` is not in a git work tree (or git
    lists nothing there: an outer repository ignores all of it). WorkdirError when git should answer and
    cannot: sending everything would ignore .gitignore."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=False,
        )
    except OSError as err:
        if any((d / ".git").exists() for d in (root, *root.parents)):
            raise WorkdirError(
                f"--workdir {root} is in a git work tree, but git cannot run here ({err.strerror}) to read"
                " its .gitignore"
            ) from None
        return None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()
        if "not a git repository" in said:
            return None
        why = said.splitlines()[0] if said else f"exit {done.returncode}"
        raise WorkdirError(f"--workdir {root}: git ls-files failed: {why}")
    return sorted({p for p in done.stdout.decode(errors="surrogateescape").split("\0") if p}) or None


def _walk(root: Path, patterns: Sequence[str]) -> list[str]:
    found = []
    for here, dirs, files in os.walk(root):
        rel = os.path.relpath(here, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        dirs[:] = sorted(d for d in dirs if not ignored(prefix + d, patterns, is_dir=True))
        # os.walk lists symlinks to directories among `dirs` without entering them: they are entries too.
        found += [prefix + d for d in dirs if os.path.islink(os.path.join(here, d))]
        found += [prefix + f for f in files if not ignored(prefix + f, patterns)]
    return sorted(found)


def candidate_paths(root: Path) -> list[str]:
    """The relative paths that may travel (before reading them)."""
    return _candidates(root)[0]


def _own_patterns(root: Path) -> tuple[str, ...]:
    try:
        return parse_ignore((root / IGNORE_FILE).read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as err:
        raise WorkdirError(f"--workdir: cannot read {root / IGNORE_FILE}: {err}") from None


def _candidates(root: Path) -> tuple[list[str], LeftOut | None]:
    """The relative paths that may travel, and what git's ignore rules left out (in a git work tree)."""
    own = _own_patterns(root)
    tracked = _git_files(root)
    if tracked is not None:
        return [p for p in tracked if not ignored(p, own)], left_out(root, own)
    return _walk(root, (*DEFAULT_EXCLUDES, *own)), None


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def scan(root: Path, limit: int = DEFAULT_LIMIT) -> Workdir:
    """DIR's files, hashed; WorkdirError when DIR is no directory or the total is above `limit` bytes (the
    sizes decide that before any file is read)."""
    if not root.is_dir():
        raise WorkdirError(f"--workdir {root}: not a directory")
    root = root.resolve()
    files: list[WorkdirFile] = []
    skipped: list[str] = []
    candidates, left = _candidates(root)
    for rel in candidates:
        path = root / rel
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue  # tracked by git but deleted in the work tree: it is not there to send
        except OSError as err:
            skipped.append(f"{rel}: cannot read it ({err.strerror}); skipped")
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            inside = os.path.realpath(path)
            if os.path.isabs(target) or not (inside == str(root) or inside.startswith(str(root) + os.sep)):
                skipped.append(f"{rel}: a symlink leaving the workdir (to {target}); skipped")
                continue
            files.append(WorkdirFile(rel, 0, target=target))
        elif stat.S_ISREG(st.st_mode):  # not a submodule's directory, a socket or a fifo: nothing to copy
            files.append(WorkdirFile(rel, st.st_size, mode=stat.S_IMODE(st.st_mode) & 0o777))
    check_limit(Workdir(root, tuple(files)), limit)
    hashed: list[WorkdirFile] = []
    for entry in files:
        if entry.target is not None:
            hashed.append(entry)
            continue
        try:
            hashed.append(replace(entry, digest=_hash_file(root / entry.path)))
        except OSError as err:
            skipped.append(f"{entry.path}: cannot read it ({err.strerror}); skipped")
    return Workdir(root, tuple(hashed), tuple(skipped), left)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def check_limit(workdir: Workdir, limit: int) -> None:
    if workdir.total <= limit:
        return
    biggest = sorted(workdir.files, key=lambda f: f.size, reverse=True)[:BIGGEST_SHOWN]
    shown = ", ".join(f"{f.path} ({_mib(f.size)})" for f in biggest)
    raise WorkdirError(
        f"--workdir {workdir.root}: {_mib(workdir.total)} in {plural(len(workdir.files), 'file', 'files')}"
        f" is above the {_mib(limit)} limit; biggest: {shown}. Leave files out in {IGNORE_FILE} (or"
        " .gitignore), or raise --workdir-limit"
    )


def left_out_by(workdir: Workdir, path: str) -> str | None:
    """Which rules left `path` (relative to DIR, or absolute inside it) out of the copy although DIR has it
    here: IGNORE_FILE, DEFAULT_RULES or GIT_RULES; None when the copy has it, or DIR does not either (then
    nothing was left out), or the launch named it as skipped."""
    root = str(workdir.root)
    if os.path.isabs(path):
        if not path.startswith(root + os.sep):
            return None
        path = os.path.relpath(path, root)
    rel = os.path.normpath(path).replace(os.sep, "/")
    if rel.startswith("../") or rel == ".." or not os.path.lexists(workdir.root / rel):
        return None
    kept = {f.path for f in workdir.files}
    if rel in kept or any(p.startswith(rel + "/") for p in kept):
        return None
    if any(line.startswith(rel + ":") for line in workdir.skipped):
        return None  # unreadable, or a symlink leaving DIR: the launch said so
    is_dir = os.path.isdir(workdir.root / rel)
    if ignored(rel, _own_patterns(workdir.root), is_dir=is_dir):
        return IGNORE_FILE
    if ignored(rel, DEFAULT_EXCLUDES, is_dir=is_dir):
        return DEFAULT_RULES
    return GIT_RULES


def missing_script(workdir: Workdir, script: str | None) -> bool:
    """A `.py` command's script that the copy will not have (ranks run in the copy)."""
    if script is None or os.path.isabs(script):
        return False
    return os.path.normpath(script) not in {f.path for f in workdir.files}
