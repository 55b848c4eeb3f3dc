"""No module of launcher/ or collectives/ over 600 lines: past that a module holds more than one concept, and
the split is cheaper while it is fresh (docs/backend.md lists each module's one concept)."""

from __future__ import annotations

from tests.layering import REPO, modules

LIMIT = 600


def test_no_module_is_over_the_limit() -> None:
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for package in ("launcher", "collectives")
        for path in modules(package)
    }
    assert {path: n for path, n in sizes.items() if n > LIMIT} == {}
