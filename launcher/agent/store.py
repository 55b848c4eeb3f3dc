"""The per-user workdir cache on a host: content-addressed objects, and complete copies built from them.

Shipped to remote hosts with the agent (see `launcher.backends.bootstrap`): stdlib-only, Python 3.7.

A manifest lists a project's files as entries `[path, kind, value, size, executable]`: kind "f" (value: the
sha256 of the content) or "l" (a symlink; value: its target, which stays inside the project). Its hash
(`manifest_hash`) names the copy. Layout under the cache root:

    objects/ab/abcdef...        one file per content hash, written to tmp/ first, checked, then renamed in
    trees/<manifest hash>/      a complete copy: built in tmp/, renamed in only once every file is there
    trees/<manifest hash>.json  its project, when it was last used and the hashes it needs (for pruning)
    trees/<manifest hash>.lock  held shared by every job running in that copy: pruning skips it
    tmp/                        unfinished work; only ever read back through a rename
    lock                        shared while a job adds to the cache, exclusive while pruning

So a transfer cut at any point leaves only tmp/ behind: an object or a copy that exists is complete, and a
later run trusts nothing else. Two jobs at once only ever rename complete things into place; the second of
two identical renames drops its own copy and uses the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

FILE, LINK = "f", "l"
HEX = "0123456789abcdef"
KEEP = 3  # copies kept per project when pruning
CHUNK = 1 << 20


def manifest_hash(entries: list[list[Any]]) -> str:
    """The name of the copy these entries describe (their order does not matter)."""
    canonical = json.dumps(sorted(entries), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def digests(entries: list[list[Any]]) -> dict[str, int]:
    """Every content hash the entries need, with its size."""
    return {e[2]: int(e[3]) for e in entries if e[1] == FILE}


CACHE_DIR_VAR = "DISTRUN_CACHE_DIR"


def default_root() -> str:
    """$DISTRUN_CACHE_DIR, else $XDG_CACHE_HOME/distrun, else ~/.cache/distrun: per user, per host."""
    given = os.environ.get(CACHE_DIR_VAR)
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "distrun")


def has_copy(mhash: str, root: str | None = None) -> bool:
    """Whether the cache holds the complete copy `mhash` (looked at, nothing created)."""
    return os.path.isdir(os.path.join(root or default_root(), "workdir", "trees", mhash))


def _safe(path: str) -> bool:
    """A relative path that stays below the copy (no .., no absolute path, no empty part)."""
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


class StoreError(Exception):
    pass


class Store:
    def __init__(self, root: str) -> None:
        self.root = os.path.join(root, "workdir")
        self.objects = os.path.join(self.root, "objects")
        self.trees = os.path.join(self.root, "trees")
        self.tmp = os.path.join(self.root, "tmp")
        for d in (self.objects, self.trees, self.tmp):
            os.makedirs(d, mode=0o700, exist_ok=True)

    # -- paths

    def object_path(self, digest: str) -> str:
        """Where the object lies; StoreError for anything but a sha256 in hex (a path must not get in)."""
        if len(digest) != 64 or digest.strip(HEX):
            raise StoreError(f"not a content hash: {digest[:80]!r}")
        return os.path.join(self.objects, digest[:2], digest[2:])

    def tree_path(self, mhash: str) -> str:
        return os.path.join(self.trees, mhash)

    # -- locks

    @contextlib.contextmanager
    def adding(self) -> Iterator[None]:
        """Held while a job adds objects or copies: pruning waits for no one and skips while it is held."""
        fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def use(self, mhash: str) -> int:
        """Mark the copy in use until the returned fd is closed (the agent closes it when the job ends)."""
        fd = os.open(self.tree_path(mhash) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    # -- what a host has

    def _has_object(self, digest: str, size: int) -> bool:
        try:
            return os.path.getsize(self.object_path(digest)) == size
        except OSError:
            return False

    def missing(self, entries: list[list[Any]], mhash: str) -> list[str]:
        """The content hashes this host lacks to build the copy (none when the copy exists already)."""
        if os.path.isdir(self.tree_path(mhash)):
            return []
        return sorted(d for d, size in digests(entries).items() if not self._has_object(d, size))

    # -- adding

    def _tmp_name(self, what: str) -> str:
        return os.path.join(self.tmp, f"{what[:16]}.{os.getpid()}.{os.urandom(4).hex()}")

    def put(self, digest: str, data: bytes) -> None:
        """Store one object, after checking that `data` hashes to `digest`."""
        if hashlib.sha256(data).hexdigest() != digest:
            raise StoreError(f"content of {digest[:12]}... arrived corrupted")
        final = self.object_path(digest)
        os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
        tmp = self._tmp_name(digest)
        # No fsync: a killed process or a cut link leaves at most a file in tmp/; what a crash of the whole
        # host could leave under the name is caught when a copy is built (`_copy_checked`).
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)

    def materialize(
        self, entries: list[list[Any]], mhash: str, project: str, checked: Any = frozenset()
    ) -> tuple[str, bool]:
        """The complete copy named `mhash`, built from objects if it does not exist yet: its path, and
        whether it was built now. Objects are checked against their hash as they are copied, except those
        in `checked` (just stored, so checked already)."""
        final = self.tree_path(mhash)
        built = not os.path.isdir(final)
        if built:
            build = self._tmp_name(mhash)
            os.mkdir(build, 0o755)
            try:
                for path, kind, value, _size, executable in entries:
                    if not _safe(path):
                        raise StoreError(f"refusing the path {path!r}")
                    dest = os.path.join(build, path)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    if kind == LINK:
                        os.symlink(value, dest)
                        continue
                    # A copy, not a hard link: a rank writing to its file must not change the object.
                    if value in checked:
                        shutil.copyfile(self.object_path(value), dest)
                    else:
                        self._copy_checked(value, dest)
                    os.chmod(dest, 0o755 if executable else 0o644)
                os.rename(build, final)
            except StoreError:
                shutil.rmtree(build, ignore_errors=True)
                raise
            except OSError as exc:
                shutil.rmtree(build, ignore_errors=True)
                if not os.path.isdir(final):  # else another job built the same copy first: use it
                    raise StoreError(f"cannot build the copy: {exc.strerror or exc}") from exc
        meta = {"project": project, "used": time.time(), "digests": sorted(digests(entries))}
        tmp = self._tmp_name(mhash + "-meta")
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, final + ".json")
        return final, built

    def _copy_checked(self, digest: str, dest: str) -> None:
        source = self.object_path(digest)
        h = hashlib.sha256()
        with open(source, "rb") as f, open(dest, "wb") as out:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != digest:
            os.unlink(source)  # so that the next sync asks for it again
            raise StoreError(f"the cached object {digest[:12]}... was damaged; launch again to replace it")

    # -- pruning

    def _meta(self) -> dict[str, dict[str, Any]]:
        found = {}
        for name in os.listdir(self.trees):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.trees, name)) as f:
                        found[name[:-5]] = json.load(f)
                except (OSError, ValueError):
                    continue
        return found

    def prune(self, keep: int = KEEP) -> list[str]:
        """Remove all but the `keep` most recently used copies of each project (never one in use), objects
        no remaining copy needs, and leftovers of interrupted work; the copies removed. Does nothing while
        another job adds to the cache."""
        fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return []
            return self._prune(keep)
        finally:
            os.close(fd)

    def _prune(self, keep: int) -> list[str]:
        meta = self._meta()
        by_project: dict[str, list[tuple[float, str]]] = {}
        for mhash, m in meta.items():
            by_project.setdefault(str(m.get("project")), []).append((float(m.get("used", 0)), mhash))
        removed = []
        for copies in by_project.values():
            for _, mhash in sorted(copies, reverse=True)[keep:]:
                if self._remove_tree(mhash):
                    removed.append(mhash)
                    del meta[mhash]
        for name in os.listdir(self.trees):  # a copy whose record is gone cannot be pruned later: now
            base = name.split(".")[0]
            if base not in meta and not name.endswith(".lock"):
                self._remove_tree(base)
        needed = {d for m in meta.values() for d in m.get("digests", ())}
        for sub in os.listdir(self.objects):
            for name in os.listdir(os.path.join(self.objects, sub)):
                if sub + name not in needed:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.objects, sub, name))
        for name in os.listdir(self.tmp):  # nobody adds now (we hold the lock): all of it is leftovers
            path = os.path.join(self.tmp, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return removed

    def _remove_tree(self, mhash: str) -> bool:
        path = self.tree_path(mhash)
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a job runs in it
            # Renamed away first, so no reader ever sees a half-removed copy under its name.
            if os.path.isdir(path):
                doomed = self._tmp_name(mhash + "-old")
                os.rename(path, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
            for suffix in (".json", ".lock"):
                with contextlib.suppress(OSError):
                    os.unlink(path + suffix)
            return True
        finally:
            os.close(fd)
