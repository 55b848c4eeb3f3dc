"""The suite's own layout: a test module imports helpers (tests/support.py, a package's support.py, a fixture
module), never another test module nor a conftest.py. A test imported into a second module runs twice, and
a helper kept in a test module is found only by whoever happens to know where it is."""

from __future__ import annotations

from pathlib import Path

from tests.conformance.backends import BACKENDS
from tests.layering import REPO, imported_names
from tests.markers import FOLDER_MARKERS, markers_for

TESTS = REPO / "tests"


def find_test_modules(root: Path = TESTS) -> list[Path]:
    return sorted(root.rglob("test_*.py"))


def imported_test_modules(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, module) of each test module or conftest.py that `path` imports.

    A name is looked for as a file both from `root` (`tests.unit.test_cli`) and beside `path` (`test_cli`,
    how pytest's default import mode would find it); `from m import name` names a module only where that
    file exists, so an imported function called `test_...` is no module."""
    found = []
    for line, name in imported_names(path, root):
        relative = Path(*name.split(".")).with_suffix(".py")
        for candidate in (root / relative, path.parent / relative):
            is_test = candidate.name.startswith("test_") or candidate.name == "conftest.py"
            if is_test and candidate.is_file():
                found.append((line, name))
                break
    return found


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    offenders = {
        str(path.relative_to(REPO)): imported
        for path in find_test_modules()
        if (imported := imported_test_modules(path))
    }
    assert offenders == {}, "move what they share to a helper (tests/support.py, a package's support.py)"


def test_the_check_sees_each_way_of_importing_a_test_module(tmp_path: Path) -> None:
    package = tmp_path / "tests" / "unit"
    package.mkdir(parents=True)
    for name in ("test_a.py", "conftest.py", "helpers.py"):
        (package / name).write_text("def test_x() -> None: ...\n")
    (tmp_path / "tests" / "support.py").write_text("")
    importer = package / "test_b.py"
    importer.write_text(
        "import tests.unit.test_a\n"
        "from tests.unit.test_a import test_x\n"
        "from tests.unit import test_a\n"
        "from . import conftest\n"
        "from test_a import test_x as again\n"
        "from tests.unit.helpers import test_x as shared\n"
        "from tests.support import nothing\n"
    )
    assert imported_test_modules(importer, tmp_path) == [
        (1, "tests.unit.test_a"),
        (2, "tests.unit.test_a"),
        (3, "tests.unit.test_a"),
        (4, "tests.unit.conftest"),
        (5, "test_a"),
    ]
    assert find_test_modules(tmp_path / "tests") == [package / "test_a.py", importer]


def test_every_test_folder_gives_its_marker_and_pyproject_declares_each() -> None:
    folders = {path.parent.relative_to(TESTS).parts[0] for path in find_test_modules()}
    assert folders <= set(FOLDER_MARKERS), "a new test folder needs its marker in tests/markers.py"
    for folder in folders:
        assert markers_for(TESTS / folder / "test_new.py", ()) == {folder}
    assert markers_for(TESTS / "gpu" / "test_perf_gpu.py", ()) == {"gpu"}
    # A test elsewhere that builds clusters still needs root: `-m "not multihost"` leaves it out.
    assert markers_for(TESTS / "integration" / "test_x.py", ["tmp_path", "make_cluster"]) == {
        "integration",
        "multihost",
    }
    assert markers_for(TESTS / "integration" / "test_x.py", ["slurm"]) == {"integration", "slurm"}
    pyproject = (REPO / "pyproject.toml").read_text()
    assert all(f'"{marker}: ' in pyproject for marker in FOLDER_MARKERS.values()), "declare it in pyproject"


def test_each_backend_of_the_conformance_suite_is_marked_with_what_it_needs() -> None:
    """`-m "not multihost and not slurm"` (no root) keeps the local backend's scenarios and only those."""
    marks = {param.id: {mark.name for mark in param.marks} for param in BACKENDS}
    assert marks == {"local": {"integration"}, "ssh": {"multihost"}, "slurm": {"slurm"}}
