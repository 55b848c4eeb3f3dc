"""Which markers a test gets, from its folder and its fixtures (tests/conftest.py applies them)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Each folder's marker (pyproject's `markers` say what each needs): a test added to a folder has it at once.
# tests/conformance runs on every backend: its `backend` fixture's parameters carry what each one needs.
FOLDER_MARKERS = {name: name for name in ("unit", "integration", "multihost", "slurm", "gpu", "conformance")}
# A test elsewhere that takes one of these fixtures needs what that folder's tests need.
FIXTURE_MARKERS = {"cluster": "multihost", "make_cluster": "multihost", "slurm": "slurm"}


def markers_for(path: Path, fixtures: Iterable[str]) -> set[str]:
    """The markers of a test at `path` taking `fixtures`: its folder's, and those of the clusters it uses."""
    found: set[str] = set()
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        folder = ""
    if folder in FOLDER_MARKERS:
        found.add(FOLDER_MARKERS[folder])
    found.update(FIXTURE_MARKERS[name] for name in fixtures if name in FIXTURE_MARKERS)
    return found
