"""--workdir's pure parts: which files travel, the manifest, what a host lacks, the cache and its pruning,
the agent's receiving side, and the same-stack comparison."""

from __future__ import annotations

import hashlib
import json
import os
import select
import zlib
from pathlib import Path
from typing import Any

import pytest

from launcher.agent.protocol import BLOB_HEADER, BLOB_ZLIB, SYNCED, WANT, FetchRequest, Synced, SyncRequest
from launcher.agent.receive import Receiver
from launcher.agent.store import Store, StoreError, manifest_hash
from launcher.core.same_software import differences
from launcher.workdir import files as wdfiles
from launcher.workdir.files import WorkdirError, ignored, missing_script, parse_ignore, scan
from launcher.workdir.sync import Chain
from tests.support import write_tree


@pytest.mark.parametrize(
    ("path", "patterns", "is_dir", "expected"),
    [
        ("a/__pycache__/x.pyc", ("__pycache__/",), False, True),
        ("__pycache__", ("__pycache__/",), True, True),
        ("__pycache__", ("__pycache__/",), False, False),  # a file of that name is no directory
        ("pkg/mod.pyc", ("*.pyc",), False, True),
        ("pkg/mod.py", ("*.pyc",), False, False),
        ("data/big.bin", ("/data",), False, True),  # anchored: DIR's own data/
        ("src/data/big.bin", ("/data",), False, False),
        ("src/data/big.bin", ("data/",), False, True),  # not anchored: any data/
        ("src/data/big.bin", ("src/*/big.bin",), False, True),
        ("notes.txt", (), False, False),
    ],
)
def test_ignore_patterns(path: str, patterns: tuple[str, ...], is_dir: bool, expected: bool) -> None:
    assert ignored(path, patterns, is_dir) is expected


def test_ignore_file_drops_comments_and_blank_lines() -> None:
    assert parse_ignore(["# big files", "", "  *.ckpt  ", "/out/"]) == ("*.ckpt", "/out/")


@pytest.fixture(autouse=True)
def outside_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """tmp_path is in no git work tree: git's answer there (none), without starting git. The real git's
    answers, there and in work trees, are tests/integration/test_workdir_git.py's."""
    monkeypatch.setattr(wdfiles, "_git_files", lambda root: None)


def test_symlinks_inside_travel_outside_are_named(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write_tree(root, {"data/a.txt": "a", "train.py": "print(1)"})
    (root / "inside").symlink_to("data/a.txt")
    (root / "outside").symlink_to(tmp_path)
    workdir = scan(root)
    assert [f.path for f in workdir.files] == ["data/a.txt", "inside", "train.py"]
    assert workdir.files[1].target == "data/a.txt"
    assert workdir.skipped == (f"outside: a symlink leaving the workdir (to {tmp_path}); skipped",)


def test_unreadable_file_is_named_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {"ok.py": "", "locked.py": ""})
    real = __import__("launcher.workdir.files", fromlist=["_hash_file"])._hash_file

    def hash_file(path: Path) -> str:
        if path.name == "locked.py":  # root reads everything: the refusal is played, not provoked
            raise PermissionError(13, "Permission denied")
        return str(real(path))

    monkeypatch.setattr("launcher.workdir.files._hash_file", hash_file)
    workdir = scan(tmp_path)
    assert [f.path for f in workdir.files] == ["ok.py"]
    assert workdir.skipped == ("locked.py: cannot read it (Permission denied); skipped",)


def test_too_big_is_refused_with_the_biggest_files(tmp_path: Path) -> None:
    for name, size in (("a.bin", 3000), ("b.bin", 2000), ("c.py", 10)):
        (tmp_path / name).write_bytes(b"x" * size)
    with pytest.raises(WorkdirError) as err:
        scan(tmp_path, limit=4000)
    message = str(err.value)
    assert "above the 0.0 MiB limit" in message and "--workdir-limit" in message
    assert message.index("a.bin") < message.index("b.bin") < message.index("c.py")
    assert err.value.exit_code == 2


def test_manifest_hash_ignores_order_and_changes_with_content(tmp_path: Path) -> None:
    write_tree(tmp_path, {"a.py": "1", "b.py": "2"})
    first = scan(tmp_path)
    assert manifest_hash(list(reversed(first.entries))) == first.manifest_hash
    (tmp_path / "b.py").write_text("3")
    assert scan(tmp_path).manifest_hash != first.manifest_hash
    assert not missing_script(first, "./a.py") and missing_script(first, "c.py")


# -- the cache


def _entries(files: dict[str, bytes]) -> tuple[list[list[Any]], dict[str, bytes]]:
    entries: list[list[Any]] = []
    blobs = {}
    for path, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        entries.append([path, "f", digest, len(data), path.endswith(".sh")])
        blobs[digest] = data
    return entries, blobs


def test_store_lacks_only_what_it_has_not_and_builds_complete_copies(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    entries, blobs = _entries({"a.py": b"a", "sub/run.sh": b"#!/bin/sh\n", "same.py": b"a"})
    mhash = manifest_hash(entries)
    assert sorted(store.missing(entries, mhash)) == sorted(blobs)
    for digest, data in blobs.items():
        store.put(digest, data)
    assert store.missing(entries, mhash) == []
    path, built = store.materialize(entries, mhash, "proj")
    assert built and store.materialize(entries, mhash, "proj") == (path, False)
    assert path == os.path.join(tmp_path, "workdir", "trees", mhash)
    assert (Path(path) / "same.py").read_bytes() == b"a"
    assert os.access(Path(path) / "sub/run.sh", os.X_OK) and not os.access(Path(path) / "a.py", os.X_OK)
    assert os.listdir(store.tmp) == []


def test_store_refuses_corrupted_content_and_escaping_paths(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    with pytest.raises(StoreError, match="arrived corrupted"):
        store.put(hashlib.sha256(b"right").hexdigest(), b"wrong")
    entries, blobs = _entries({"../evil.py": b"x"})
    for digest, data in blobs.items():
        store.put(digest, data)
    with pytest.raises(StoreError, match="refusing the path"):
        store.materialize(entries, manifest_hash(entries), "proj")
    assert not (tmp_path / "workdir" / "evil.py").exists()
    assert os.listdir(store.tmp) == [], "the half-built copy is gone"


def test_interrupted_transfer_leaves_nothing_trusted(tmp_path: Path) -> None:
    """A half-written object lies only in tmp/ (never under its name), and an object cut short is wanted."""
    store = Store(str(tmp_path))
    entries, blobs = _entries({"a.py": b"a" * 100, "b.py": b"b" * 100})
    digest_a, digest_b = sorted(blobs)
    (Path(store.tmp) / "half-written").write_bytes(b"a" * 10)
    Path(store.object_path(digest_b)).parent.mkdir(parents=True, exist_ok=True)
    Path(store.object_path(digest_b)).write_bytes(b"b" * 10)  # as a crash before fsync could leave it
    mhash = manifest_hash(entries)
    assert store.missing(entries, mhash) == [digest_a, digest_b]
    store.prune()
    assert os.listdir(store.tmp) == []


def test_prune_keeps_the_last_copies_and_any_in_use(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    made = []
    for version in range(5):
        entries, blobs = _entries({"train.py": b"v%d" % version, "common.py": b"shared"})
        for digest, data in blobs.items():
            store.put(digest, data)
        mhash = manifest_hash(entries)
        store.materialize(entries, mhash, "proj")
        meta = Path(store.tree_path(mhash) + ".json")
        record = json.loads(meta.read_text())
        meta.write_text(json.dumps({**record, "used": version}))  # oldest first, whatever the clock says
        made.append(mhash)
    in_use = store.use(made[0])
    try:
        removed = store.prune(keep=2)
    finally:
        os.close(in_use)
    assert sorted(removed) == sorted(made[1:3])
    left = {name for name in os.listdir(store.trees) if "." not in name}
    assert left == {made[0], made[3], made[4]}
    shared = hashlib.sha256(b"shared").hexdigest()
    assert os.path.exists(store.object_path(shared))
    assert not os.path.exists(store.object_path(hashlib.sha256(b"v1").hexdigest()))


def test_two_jobs_building_the_same_copy_both_get_it(tmp_path: Path) -> None:
    first, second = Store(str(tmp_path)), Store(str(tmp_path))
    entries, blobs = _entries({"a.py": b"a"})
    for digest, data in blobs.items():
        first.put(digest, data)
        second.put(digest, data)
    mhash = manifest_hash(entries)
    assert first.materialize(entries, mhash, "p")[0] == second.materialize(entries, mhash, "p")[0]


def _synced(replies: list[tuple[int, Any]]) -> Synced:
    ((kind, synced),) = replies
    assert kind == SYNCED
    assert isinstance(synced, Synced)
    return synced


def test_receiver_asks_for_what_it_lacks_then_reports_the_copy(tmp_path: Path) -> None:
    entries, blobs = _entries({"a.py": b"print('a')\n" * 50, "b.py": b"b"})
    mhash = manifest_hash(entries)
    receiver = Receiver(str(tmp_path))
    ((kind, want),) = receiver.start(SyncRequest("p", entries, mhash))
    assert kind == WANT and sorted(want.digests) == sorted(blobs)
    replies = []
    for digest, data in blobs.items():
        packed = zlib.compress(data)
        replies += receiver.blob(BLOB_HEADER.pack(BLOB_ZLIB, bytes.fromhex(digest)) + packed)
    synced = _synced(replies)
    assert synced.error == "" and synced.manifest_hash == mhash and synced.received > 0
    assert (Path(synced.path) / "b.py").read_bytes() == b"b"
    # A second sync of the same copy wants nothing and answers at once.
    again = Receiver(str(tmp_path)).start(SyncRequest("p", entries, mhash))
    assert [kind for kind, _ in again] == [WANT, SYNCED]


def test_receiver_reports_a_corrupted_object(tmp_path: Path) -> None:
    entries, blobs = _entries({"a.py": b"a"})
    receiver = Receiver(str(tmp_path))
    receiver.start(SyncRequest("p", entries, manifest_hash(entries)))
    (digest,) = blobs
    replies = receiver.blob(BLOB_HEADER.pack(0, bytes.fromhex(digest)) + b"not a")
    assert "arrived corrupted" in _synced(replies).error


def test_a_host_feeds_a_peer_over_tcp_while_it_is_fed(tmp_path: Path) -> None:
    entries, blobs = _entries({"a.py": b"a" * 1000, "b.py": b"b"})
    mhash = manifest_hash(entries)
    seed = Receiver(str(tmp_path / "seed"))
    ((_, want),) = seed.start(SyncRequest("p", entries, mhash, serve_token="t0k"))
    assert want.serve_port > 0
    peer = Receiver(str(tmp_path / "peer"))
    peer.start(SyncRequest("p", entries, mhash))
    try:
        # The peer asks before the seed has anything: the seed answers each object once it arrives.
        assert peer.fetch(FetchRequest("127.0.0.1", want.serve_port, "t0k", sorted(blobs))) == []
        replies = []
        for digest, data in blobs.items():
            replies += seed.blob(BLOB_HEADER.pack(0, bytes.fromhex(digest)) + data)
        assert _synced(replies).error == ""
        assert select.select([peer.fileno()], [], [], 30)[0]
        synced = _synced(peer.fetched())
        assert synced.error == "" and synced.received == 0 and synced.from_peers > 1000
        assert (Path(synced.path) / "a.py").read_bytes() == b"a" * 1000
        # A wrong token gets nothing; the fetch fails and the host asks the launcher for what it lacks.
        third = Receiver(str(tmp_path / "third"))
        third.start(SyncRequest("p", entries, mhash))
        third.fetch(FetchRequest("127.0.0.1", want.serve_port, "wrong", sorted(blobs)))
        assert select.select([third.fileno()], [], [], 30)[0]
        ((kind, again),) = third.fetched()
        assert kind == WANT and sorted(again.digests) == sorted(blobs) and "closed" in again.error
    finally:
        seed.stop_serving()


@pytest.mark.parametrize(
    ("relay", "events", "expected"),
    [
        # No relaying: the launcher feeds every host.
        (False, ["want h1", "want h2", "want h3"], {"h1": None, "h2": None, "h3": None}),
        # Relaying: a chain from the launcher, each host fed by the one before it.
        (True, ["want h1", "want h2", "want h3"], {"h1": None, "h2": "h1", "h3": "h2"}),
        # A host that cannot serve (no address others can reach) is fed but feeds no one.
        (True, ["want h1", "want-quiet h2", "want h3"], {"h1": None, "h2": "h1", "h3": "h1"}),
        # A host with the whole copy heads the chain: the launcher sends nothing.
        (True, ["has h0", "want h1", "want h2"], {"h1": "h0", "h2": "h1"}),
        # ... unless the chain had started already.
        (True, ["want h1", "has h0", "want h2"], {"h1": None, "h2": "h1"}),
        # A failed fetch: the launcher feeds that host; the chain goes on behind it.
        (True, ["want h1", "want h2", "fallback h2", "want h3"], {"h1": None, "h2": None, "h3": "h2"}),
    ],
)
def test_chain(relay: bool, events: list[str], expected: dict[str, str | None]) -> None:
    chain = Chain(relay)
    for event in events:
        what, host = event.split()
        if what == "has":
            chain.has_copy(host)
        elif what == "fallback":
            chain.fallback(host)
        else:
            chain.want(host, serves=what == "want")
    assert chain.fed_by == expected


# -- same code, same stack


STACK = {"workdir": "abc", "python": "3.11.7", "torch": "2.13.0", "cuda": "12.1", "nccl": "2.21.5"}


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ([("h1", STACK), ("h2", STACK)], []),
        (
            [("h1", STACK), ("h2", STACK), ("h3", {**STACK, "torch": "2.12.0"})],
            ["h3: torch 2.12.0, others 2.13.0"],
        ),
        (
            [("h1", STACK), ("h2", {**STACK, "workdir": "def", "python": "3.10.1"}), ("h3", STACK)],
            ["h2: workdir def, others abc; Python 3.10.1, others 3.11.7"],
        ),
        (
            [("h1", {**STACK, "cuda": ""}), ("h2", STACK)],  # a tie: the first host's values are "the others"
            ["h2: CUDA 12.1, others none"],
        ),
    ],
)
def test_differences(hosts: list[tuple[str, dict[str, str]]], expected: list[str]) -> None:
    assert differences(hosts) == expected


def test_prune_waits_for_no_one_and_removes_nothing_while_a_job_adds(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    _, blobs = _entries({"a.py": b"a"})
    for digest, data in blobs.items():
        store.put(digest, data)
    (Path(store.tmp) / "another-job-writing").write_bytes(b"half")
    with Store(str(tmp_path)).adding():  # another job's sync, between SYNC and SYNCED
        assert store.prune(keep=0) == []
        assert os.listdir(store.tmp) == ["another-job-writing"]
        assert os.path.exists(store.object_path(next(iter(blobs))))


@pytest.mark.parametrize("digest", ["../../../../etc/passwd", "AB" * 32, "a" * 63, "a" * 64 + "/x", "g" * 64])
def test_only_content_hashes_name_objects(tmp_path: Path, digest: str) -> None:
    with pytest.raises(StoreError, match="not a content hash"):
        Store(str(tmp_path)).object_path(digest)
