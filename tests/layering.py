"""The import graph of our own packages, read from the source.

Every import at any depth counts, lazy ones inside functions and `if TYPE_CHECKING:` ones included: each is a
dependency that someone reading the code must follow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: Path, root: Path = REPO) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in `path`; `from a import b` yields both `a` and `a.b` (b may be a
    module), relative imports resolved against the module's package."""
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def modules(package: str, root: Path = REPO) -> list[Path]:
    return sorted((root / package).rglob("*.py"))
