"""The per-user workdir cache on a host: content-addressed objects, and complete copies built from them.

Shipped to remote hosts with the agent (see `launcher.backends.bootstrap`): stdlib-only, Python 3.7.

A manifest lists a project's files as entries `[path, kind, value, size, mode]`: kind "f" (value: the
sha256 of the content; mode: the file's permission bits, or a bool for the execute bit alone) or "l" (a
symlink; value: its target, which stays inside the project). Its hash (`manifest_hash`) names the copy.
Layout under the cache root:

    objects/ab/abcdef...        one file per content hash, written to tmp/ first, checked, then renamed in
    objects/ab/abcdef....555    the same content with another mode (a hard link shares its mode), made from it
    trees/<manifest hash>/      a complete copy: built in tmp/, renamed in only once every file is there
    trees/<manifest hash>.json  its project, when it was last used and the hashes it needs (for pruning)
    trees/<manifest hash>.lock  held shared by every job running in that copy: pruning skips it
    tmp/                        unfinished work; only ever read back through a rename
    lock                        shared while a job adds to the cache, exclusive while pruning

So a transfer cut at any point leaves only tmp/ behind: an object or a copy that exists is complete, and a
later run trusts nothing else. Whoever writes in tmp/ removes what it wrote when it fails (a full disk),
and what a killed process left there is reclaimed by the next sync on that host (`reclaim`) or by pruning.
Two jobs at once only ever rename complete things into place; the second of two identical renames drops its
own copy and uses the first.

A copy's files are hard links to the objects where the file system allows (else sparse copies), so the cache
holds each content once. They are read-only (the mode without its write bits), and every object and copy file
carries the mtime STAMP: a rank that writes to one anyway (as root, or after a chmod) changes its mtime, and
`check` finds that before the next job starts in the copy, hashes what changed, drops a damaged object (so it
is sent again) and puts the file right. An object never changes unnoticed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from launcher.agent.cache_root import default_root

if TYPE_CHECKING:
    import hashlib

FILE, LINK = "f", "l"
HEX = "0123456789abcdef"
KEEP = 3  # copies kept per project when pruning
CHUNK = 1 << 20
BLOCK = 1 << 16  # zero blocks of this size are left as holes when writing (sparse files stay sparse)
_ZEROS = bytes(BLOCK)
# Every object and copy file has this mtime (2000-01-01 UTC, after zip's 1980 floor): a write to one moves its
# mtime, which is how `Store.check` notices it without hashing everything.
STAMP = 946684800
OBJECT_MODE = 0o444


def _sha256(data: bytes = b"") -> hashlib._Hash:
    """hashlib loads at the first hash: a plain job's agent never hashes (it was ~5 ms of every agent's
    start)."""
    import hashlib

    return hashlib.sha256(data)


def manifest_hash(entries: list[list[Any]]) -> str:
    """The name of the copy these entries describe (their order does not matter)."""
    canonical = json.dumps(sorted(entries), separators=(",", ":"), ensure_ascii=False)
    return _sha256(canonical.encode()).hexdigest()


def digests(entries: list[list[Any]]) -> dict[str, int]:
    """Every content hash the entries need, with its size."""
    return {e[2]: int(e[3]) for e in entries if e[1] == FILE}


def copy_mode(mode: Any) -> int:
    """The mode of a file in the copy: the manifest's permission bits less every write bit (ranks do not
    write to the copy's files). A bool is the execute bit alone."""
    if isinstance(mode, bool):
        mode = 0o755 if mode else 0o644
    return int(mode) & 0o555


def write_sparse(fd: int, chunks: Iterator[bytes] | list[bytes], size: int) -> None:
    """Write `chunks` (BLOCK-sized, but the last) to `fd`, leaving all-zero blocks as holes; `size` in all."""
    for chunk in chunks:
        if len(chunk) == BLOCK and chunk == _ZEROS:
            os.lseek(fd, BLOCK, os.SEEK_CUR)
            continue
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
    os.ftruncate(fd, size)  # a hole at the end has no block to write: the size says where the file ends


def _blocks(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), BLOCK):
        yield data[start : start + BLOCK]


def _read_blocks(f: Any) -> Iterator[bytes]:
    while True:
        chunk = f.read(BLOCK)
        if not chunk:
            return
        yield chunk


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _remove(path: str) -> None:
    """`path` gone, whatever it is (a file, a link, a directory tree); no error if it was not there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _parents(path: str) -> list[str]:
    """The directories above a relative path, outermost first: `a/b/c` -> `a`, `a/b`."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _untouched(st: os.stat_result, size: int, mode: int) -> bool:
    """A regular file as distrun left it: its size, its mode, the STAMP mtime (cheap: no content read)."""
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_size == size
        and stat.S_IMODE(st.st_mode) == mode
        and st.st_mtime_ns == STAMP * 1_000_000_000
    )


def _hash_path(path: str) -> str:
    h = _sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


# A file system without hard links (or a full link count) answers these: the copy then gets a copy.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


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
        self.pending: set[str] = set()  # what the sync in progress needs (`missing`): never dropped for room
        self._adding_fd: int | None = None

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
            self._adding_fd = fd
            yield
        finally:
            self._adding_fd = None
            os.close(fd)

    def make_room(self) -> bool:
        """After a full disk while adding: remove what neither a copy nor this sync needs (the objects of a
        sync that the full disk cut, leftovers in tmp/), if no other job adds to the cache now; whether
        anything was removed. So a sync that filled the disk never keeps a later one that fits from running.
        """
        fd = self._adding_fd
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # from shared: only if no one else adds
        except OSError:
            fcntl.flock(fd, fcntl.LOCK_SH)  # a failed conversion has dropped the shared lock: back to it
            return False
        try:
            meta = self._meta()
            return self._drop_objects(meta, self.pending) + self._clear_tmp() > 0
        finally:
            fcntl.flock(fd, fcntl.LOCK_SH)

    def use(self, mhash: str) -> int:
        """Mark the copy in use until the returned fd is closed (the agent closes it when the job ends)."""
        fd = os.open(self.tree_path(mhash) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def variant_path(self, digest: str, mode: int) -> str:
        """The object with `mode` (a hard link shares its mode: each mode the copies need is one inode)."""
        base = self.object_path(digest)
        return base if mode == OBJECT_MODE else f"{base}.{mode:o}"

    # -- what a host has

    def _has_object(self, digest: str, size: int) -> bool:
        """The object is there and intact: untouched (STAMP, size), or, written to since, still its hash."""
        path = self.object_path(digest)
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if _untouched(st, size, OBJECT_MODE):
            return True
        if stat.S_ISREG(st.st_mode) and st.st_size == size and _hash_path(path) == digest:
            self._restamp(path, OBJECT_MODE)
            return True
        _remove(path)  # damaged (or a leftover of a host's crash): it is sent again
        return False

    def missing(self, entries: list[list[Any]], mhash: str) -> list[str]:
        """The content hashes this host lacks to build the copy, or to put right what changed in it since it
        was built (`check`): none when the copy is as its name says."""
        self.pending = set(digests(entries))
        if os.path.isdir(self.tree_path(mhash)):
            needed = {e[2]: int(e[3]) for e in self.check(entries, mhash) if e[1] == FILE}
        else:
            needed = digests(entries)
        return sorted(d for d, size in needed.items() if not self._has_object(d, size))

    def check(self, entries: list[list[Any]], mhash: str) -> list[list[Any]]:
        """The entries of the existing copy `mhash` that are not what the manifest says (a rank wrote to,
        replaced, removed or chmodded them). Cheap for untouched files (their stat); a file whose stat
        differs is hashed: the same content is stamped again, changed content is reported, and an object
        it shares an inode with (a hard link written through) is removed, to be sent again."""
        root = self.tree_path(mhash)
        bad = []
        dirs: dict[str, bool] = {}  # a directory of the copy: whether it is one (not a symlink, say)
        for entry in entries:
            path, kind, value, size, mode = entry
            if not _safe(path):
                raise StoreError(f"refusing the path {path!r}")
            dest = os.path.join(root, path)
            if not all(self._is_dir(root, d, dirs) for d in _parents(path)):
                bad.append(entry)  # reached through a symlink or worse: what lies there is not the copy's
                continue
            try:
                st = os.lstat(dest)
            except OSError:
                bad.append(entry)
                continue
            if kind == LINK:
                if not stat.S_ISLNK(st.st_mode) or os.readlink(dest) != value:
                    bad.append(entry)
                continue
            wanted = copy_mode(mode)
            if _untouched(st, int(size), wanted):
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == int(size) and _hash_path(dest) == value:
                self._restamp(dest, wanted)
                continue
            bad.append(entry)
            for obj in {self.object_path(value), self.variant_path(value, wanted)}:
                with contextlib.suppress(OSError):
                    if os.path.samestat(os.lstat(obj), st):
                        os.unlink(obj)
        return bad

    @staticmethod
    def _is_dir(root: str, rel: str, known: dict[str, bool]) -> bool:
        if rel not in known:
            try:
                known[rel] = stat.S_ISDIR(os.lstat(os.path.join(root, rel)).st_mode)
            except OSError:
                known[rel] = False
        return known[rel]

    # -- adding

    def _tmp_name(self, what: str) -> str:
        # The pid and host say whose it is, so that `reclaim` removes only what a process that is gone left.
        return os.path.join(
            self.tmp, f"{what[:16]}.{os.getpid()}.{os.urandom(4).hex()}.{socket.gethostname()}"
        )

    def reclaim(self) -> int:
        """Remove from tmp/ what processes of this host that are gone left there (a transfer cut by a kill);
        how many. A cache shared by hosts (a home on NFS) keeps other hosts' work in progress."""
        removed = 0
        here = socket.gethostname()
        for name in os.listdir(self.tmp):
            parts = name.split(".", 3)
            if len(parts) == 4 and parts[3] == here and parts[1].isdigit() and not _alive(int(parts[1])):
                _remove(os.path.join(self.tmp, name))
                removed += 1
        return removed

    @contextlib.contextmanager
    def _writing(self, what: str, final: str, mode: int) -> Iterator[int]:
        """A new file at `final`, written to tmp/ through the yielded fd, renamed in with `mode` and STAMP;
        on any failure (a full disk) the unfinished file is removed at once."""
        tmp = self._tmp_name(what)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                yield fd
                os.fchmod(fd, mode)
                os.utime(fd, ns=(STAMP * 1_000_000_000,) * 2)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def put(self, digest: str, data: bytes) -> None:
        """Store one object, after checking that `data` hashes to `digest`."""
        if _sha256(data).hexdigest() != digest:
            raise StoreError(f"content of {digest[:12]}... arrived corrupted")
        if self._has_object(digest, len(data)):
            return  # copies link it: replacing it would store the content twice
        final = self.object_path(digest)
        os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
        # No fsync: a killed process or a cut link leaves at most a file in tmp/; what a crash of the whole
        # host could leave under the name is caught by its size or hash (`_has_object`, `_source`).
        try:
            with self._writing(digest, final, OBJECT_MODE) as fd:
                write_sparse(fd, _blocks(data), len(data))
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not self.make_room():
                raise
            with self._writing(digest, final, OBJECT_MODE) as fd:
                write_sparse(fd, _blocks(data), len(data))

    def _restamp(self, path: str, mode: int) -> None:
        os.chmod(path, mode)
        os.utime(path, ns=(STAMP * 1_000_000_000,) * 2)

    def _source(self, digest: str, mode: int, verified: set[str]) -> str:
        """The object (or its variant with `mode`) to link into a copy; hashed first unless in `verified`."""
        base = self.object_path(digest)
        if digest not in verified:
            if _hash_path(base) != digest:
                os.unlink(base)  # so that the next sync asks for it again
                raise StoreError(
                    f"the cached object {digest[:12]}... was damaged; launch again to replace it"
                )
            verified.add(digest)
        path = self.variant_path(digest, mode)
        if path != base:
            try:
                ready = _untouched(os.lstat(path), os.path.getsize(base), mode)
            except OSError:
                ready = False
            if not ready:
                self._copy(base, path, mode)
        return path

    def _copy(self, source: str, dest: str, mode: int) -> None:
        """A sparse copy of `source` at `dest` with `mode` and STAMP, renamed in whole."""
        with open(source, "rb") as f, self._writing(os.path.basename(dest), dest, mode) as fd:
            write_sparse(fd, _read_blocks(f), os.fstat(f.fileno()).st_size)

    def _place(self, entry: list[Any], dest: str, verified: set[str]) -> None:
        """One entry of a copy at `dest` (nothing there yet): a symlink, or a hard link to its object, or
        (where the file system has no hard links) a copy of it."""
        _path, kind, value, _size, mode = entry
        if kind == LINK:
            os.symlink(value, dest)
            return
        wanted = copy_mode(mode)
        source = self._source(value, wanted, verified)
        try:
            os.link(source, dest)
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            self._copy(source, dest, wanted)

    def materialize(
        self, entries: list[list[Any]], mhash: str, project: str, checked: Any = frozenset()
    ) -> tuple[str, bool]:
        """The complete copy named `mhash`, built from objects if it does not exist yet (else put right where
        `check` finds it changed): its path, and whether it was built now. Objects are checked against their
        hash as they are linked in, except those in `checked` (just stored, so checked already)."""
        final = self.tree_path(mhash)
        built = not os.path.isdir(final)
        verified = set(checked)
        if built:
            build = self._tmp_name(mhash)
            os.mkdir(build, 0o755)
            try:
                for entry in entries:
                    if not _safe(entry[0]):
                        raise StoreError(f"refusing the path {entry[0]!r}")
                    dest = os.path.join(build, entry[0])
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    self._place(entry, dest, verified)
                os.rename(build, final)
            except StoreError:
                shutil.rmtree(build, ignore_errors=True)
                raise
            except OSError as exc:
                shutil.rmtree(build, ignore_errors=True)
                if not os.path.isdir(final):  # else another job built the same copy first: use it
                    raise StoreError(f"cannot build the copy: {exc.strerror or exc}") from exc
            except BaseException:
                shutil.rmtree(build, ignore_errors=True)
                raise
        else:
            self.repair(entries, mhash, verified)
        meta = {"project": project, "used": time.time(), "digests": sorted(digests(entries))}
        tmp = self._tmp_name(mhash + "-meta")
        try:
            with open(tmp, "w") as f:
                json.dump(meta, f)
            os.replace(tmp, final + ".json")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return final, built

    def repair(self, entries: list[list[Any]], mhash: str, verified: set[str] | None = None) -> list[str]:
        """Put right every entry of the existing copy that `check` finds changed, each replaced whole by a
        rename (a job running in the copy sees the old file or the right one); the paths put right."""
        root = self.tree_path(mhash)
        verified = set() if verified is None else verified
        fixed = []
        for entry in self.check(entries, mhash):
            dest = os.path.join(root, entry[0])
            for parent in _parents(entry[0]):  # never written through a symlink a rank left in its place
                where = os.path.join(root, parent)
                if os.path.lexists(where) and (os.path.islink(where) or not os.path.isdir(where)):
                    _remove(where)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.isdir(dest) and not os.path.islink(dest):
                _remove(dest)
            tmp = self._tmp_name(mhash + "-fix")
            try:
                self._place(entry, tmp, verified)
                os.replace(tmp, dest)
            except BaseException:
                _remove(tmp)
                raise
            fixed.append(entry[0])
        return fixed

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
        self._drop_objects(meta)
        self._clear_tmp()
        return removed

    def _drop_objects(self, meta: dict[str, dict[str, Any]], keep: Any = frozenset()) -> int:
        """Remove the objects (with their variants by mode) that no copy in `meta` needs, nor `keep`."""
        needed = {d for m in meta.values() for d in m.get("digests", ())} | set(keep)
        removed = 0
        for sub in os.listdir(self.objects):
            for name in os.listdir(os.path.join(self.objects, sub)):
                if sub + name.split(".")[0] not in needed:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.objects, sub, name))
                        removed += 1
        return removed

    def _clear_tmp(self) -> int:
        """Remove everything in tmp/; only while holding the cache's lock exclusively (nobody adds)."""
        names = os.listdir(self.tmp)
        for name in names:
            _remove(os.path.join(self.tmp, name))
        return len(names)

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
