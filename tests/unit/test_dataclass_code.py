"""The kept code of dataclasses' methods (launcher/agent/dataclass_code.py): the classes made with it are the
classes made without it, the code is read back instead of compiled, and every trouble falls back to
compiling."""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.agent import dataclass_code
from launcher.agent.cache_root import private_code_dir
from tests.support import REPO


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[Path]:
    """The cache installed in this process over `tmp_path`, and taken out again after the test."""
    dataclass_code.uninstall()
    dataclass_code.install(str(tmp_path), "test")
    try:
        yield tmp_path / str(dataclass_code.file_name("test"))
    finally:
        dataclass_code.uninstall()


def _make() -> type[Any]:
    """A record with what the launcher's records use: frozen, defaults, a factory, fields out of the repr and
    the comparison."""

    @dataclasses.dataclass(frozen=True)
    class Record:
        name: str
        ranks: tuple[int, ...] = ()
        env: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)
        secret: str = dataclasses.field(default="", repr=False)

    return Record


def _behaviour(cls: type[Any]) -> dict[str, object]:
    a = cls("a", (1, 2), {"K": "v"}, "s")
    frozen = False
    try:
        a.name = "b"
    except dataclasses.FrozenInstanceError:
        frozen = True
    return {
        "repr": repr(a),
        "eq": a == cls("a", (1, 2), {"K": "v"}, "s"),
        "ne": a != cls("b"),
        "hash": hash(cls("x")) == hash(cls("x")),
        "default": cls("c").env == {} and cls("c").env is not cls("c").env,
        "frozen": frozen,
        "replace": dataclasses.replace(a, name="z").name,
        "fields": [f.name for f in dataclasses.fields(cls)],
    }


def test_a_record_made_with_kept_code_is_the_record_made_without(kept: Path) -> None:
    with_cache = _behaviour(_make())
    dataclass_code.uninstall()
    without = _behaviour(_make())
    assert with_cache == without


def test_annotations_stay_objects(kept: Path) -> None:
    """The cache's own module has `from __future__ import annotations`: compiled under it, the texts would
    have turned each annotation of a generated method into a string (this test module's records have
    strings anyway, so the record here is made without one)."""
    record = dataclasses.make_dataclass("Made", [("ranks", int)], frozen=True)
    assert vars(record)["__init__"].__annotations__ == {"ranks": int, "return": None}


def test_the_code_is_kept_and_read_back_instead_of_compiled(kept: Path) -> None:
    _make()
    dataclass_code.save()
    assert kept.is_file()
    size = kept.stat().st_size
    dataclass_code.uninstall()
    dataclass_code.install(str(kept.parent), "test")
    cache = dataclass_code._cache
    assert cache is not None and cache.codes, "the file's code was not read"
    _behaviour(_make())
    assert not cache.added, "a method was compiled again though its code was kept"
    dataclass_code.save()
    assert kept.stat().st_size == size  # nothing new: not rewritten


def test_a_damaged_file_is_compiled_over(kept: Path) -> None:
    dataclass_code.uninstall()
    kept.write_bytes(b"\x00not marshal")
    dataclass_code.install(str(kept.parent), "test")
    assert _behaviour(_make())["frozen"] is True
    dataclass_code.save()
    dataclass_code.uninstall()
    dataclass_code.install(str(kept.parent), "test")
    assert dataclass_code._cache is not None and dataclass_code._cache.codes


def test_a_forked_child_leaves_the_file_to_its_parent(kept: Path) -> None:
    _make()
    assert dataclass_code._cache is not None
    dataclass_code._cache.pid = os.getpid() + 1  # as in the forked local agent: the table is its parent's
    dataclass_code.save()
    assert not kept.exists()


def test_past_keep_a_run_keeps_only_what_it_used(kept: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = dataclass_code._cache
    assert cache is not None
    for n in range(5):
        cache.codes[f"# stale {n}"] = compile("pass", "<string>", "exec")
    monkeypatch.setattr(dataclass_code, "KEEP", 3)
    _make()
    used = set(cache.used)
    dataclass_code.save()
    dataclass_code.uninstall()
    dataclass_code.install(str(kept.parent), "test")
    assert dataclass_code._cache is not None
    assert set(dataclass_code._cache.codes) == used


def test_a_cache_directory_others_can_write_to_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRUN_CACHE_DIR", str(tmp_path))
    (tmp_path / "code").mkdir(mode=0o700)
    assert private_code_dir() == str(tmp_path / "code")
    (tmp_path / "code").chmod(0o777)
    assert private_code_dir() is None
    dataclass_code.uninstall()
    try:
        dataclass_code.install(private_code_dir(), "test")
        _make()
        dataclass_code.save()
    finally:
        dataclass_code.uninstall()
    assert list((tmp_path / "code").iterdir()) == []


def test_other_uses_of_exec_pass_through(kept: Path) -> None:
    space: dict[str, Any] = {}
    code = compile("x = 6 * 7", "<test>", "exec")
    vars(dataclasses)["exec"](code, space)
    assert space["x"] == 42
    cache = dataclass_code._cache
    assert cache is not None and not cache.added


def test_every_record_of_the_launcher_has_a_docstring() -> None:
    """Without one, `dataclasses` writes one from `inspect.signature` when the class is made: 0.3-2.5 ms of
    import each, which the kept code cannot save."""
    undocumented = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and any("dataclass" in ast.unparse(d) for d in node.decorator_list)
                and ast.get_docstring(node) is None
            ):
                undocumented.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert undocumented == []
