"""The import graph of our own packages, read from the source.

Every import at any depth counts, lazy ones inside functions and `if TYPE_CHECKING:` ones included: each is a
dependency that someone reading the code must follow."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


def unit_of(name: str, units: Iterable[str]) -> str | None:
    """The most specific of `units` (packages or modules) that `name`, a module or a name in one, falls in."""
    found = [u for u in units if name == u or name.startswith(u + ".")]
    return max(found, key=len) if found else None


def imported_units(names: Iterable[tuple[int, str]], units: Iterable[str]) -> set[tuple[int, str]]:
    """(line, unit) of each of `units` that the `imported_names` of one module import.

    `from pkg import mod` yields `pkg` as well as `pkg.mod`; where `pkg.mod` is a unit of its own, the line
    imports `pkg` only as every import of `pkg.mod` does (its __init__ runs first), so only `pkg.mod` counts.
    """
    units = set(units)
    by_line: dict[int, list[str]] = {}
    for line, name in names:
        by_line.setdefault(line, []).append(name)
    found: set[tuple[int, str]] = set()
    for line, line_names in by_line.items():
        hit = {name: unit_of(name, units) for name in line_names}
        for name, unit in hit.items():
            if unit is None:
                continue
            deeper = [hit[other] for other in line_names if other.startswith(name + ".")]
            if deeper and all(d is not None and d != unit for d in deeper):
                continue
            found.add((line, unit))
    return found


def layer_violations(
    layers: Sequence[Sequence[str]],
    imports: Mapping[str, Iterable[tuple[int, str]]],
    forbidden: Sequence[str] = (),
) -> list[str]:
    """`module:line imports X (...)` for every import of a unit in the importer's own layer or above it, of a
    `forbidden` package, and `module: in no layer` for a module in no unit of `layers` (bottom first)."""
    level = {unit: i for i, layer in enumerate(layers) for unit in layer}
    found = []
    for module, module_names in imports.items():
        own = unit_of(module, level)
        if own is None:
            found.append(f"{module}: in no layer")
            continue
        names = list(module_names)
        found += [
            f"{module}:{line} imports {name}, a package it must never import"
            for line, name in names
            if unit_of(name, forbidden) is not None
        ]
        for line, target in imported_units(names, level):
            if target != own and level[target] >= level[own]:
                found.append(
                    f"{module}:{line} imports {target} (layer {level[target] + 1}, not below {own}'s)"
                )
    return sorted(set(found))


def package_imports(package: str) -> dict[str, list[tuple[int, str]]]:
    """Every module of `package` and its `imported_names`."""
    return {module_name(path): list(imported_names(path)) for path in modules(package)}
