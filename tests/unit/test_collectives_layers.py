"""The layers of `collectives`, bottom first: a module imports only modules of lower layers, never one beside
it or above it, so the package's import graph stays a DAG. The worker library never imports the launcher.

docs/collectives.md ("Modules") lists the same order, one line a module.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tests.layering import REPO, imported_names, module_name, modules

LAYERS: list[list[str]] = [
    # Values and leaf helpers: they import nothing of ours.
    [
        "collectives.errors",
        "collectives.reduce_op",
        "collectives.leaving",
        "collectives.compression",
        "collectives.buckets",
        "collectives.features",
        "collectives.registry",
        "collectives.elastic.channel",
        "collectives.elastic.failures",
    ],
    ["collectives.placement", "collectives.negotiation", "collectives.grad_buckets"],
    ["collectives.context", "collectives.ops._handle"],
    ["collectives.process_sets", "collectives.data", "collectives.ops._common"],
    [
        "collectives.objects",
        "collectives.coordination",
        "collectives.ops._allreduce",
        "collectives.ops._grouped_allreduce",
        "collectives.ops._alltoall",
    ],
    ["collectives.checkpoint", "collectives.ops._allgather", "collectives.ops._broadcast"],
    ["collectives.ops._reducescatter", "collectives.ops._sparse"],
    ["collectives.ops"],
    ["collectives.optimizer", "collectives.metrics"],
    ["collectives.lr", "collectives.broadcast_state"],
    ["collectives.elastic.state", "collectives.elastic.sampler"],
    ["collectives.elastic.torch_state", "collectives.elastic.run"],
    ["collectives.elastic"],
    # The package's lazy table of names, which reaches every module below on first use.
    ["collectives"],
    ["collectives.bench"],
]

PACKAGE = "collectives"


def _imports(names: Iterable[tuple[int, str]], known: set[str]) -> set[str]:
    """The modules of ``known`` that ``names`` (from :func:`imported_names`) import.

    ``from pkg import mod`` yields ``pkg`` as well as ``pkg.mod``; it imports ``pkg`` only as every import of
    ``pkg.mod`` does, so ``pkg`` counts only where the line also takes a name that is not a module of it.
    """
    by_line: dict[int, list[str]] = defaultdict(list)
    for line, name in names:
        by_line[line].append(name)
    found: set[str] = set()
    for line_names in by_line.values():
        for name in line_names:
            if name not in known:
                continue
            below = [other for other in line_names if other.startswith(f"{name}.")]
            if below and all(other in known for other in below):
                continue
            found.add(name)
    return found


def violations(graph: Mapping[str, Iterable[str]], layers: Sequence[Sequence[str]]) -> list[str]:
    """Every import in ``graph`` (module -> modules it imports) of a module in its own layer or above it;
    layers are numbered from 1, as in the docs."""
    layer_of = {name: index for index, layer in enumerate(layers, start=1) for name in layer}
    found: list[str] = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            if target != module and target in layer_of and layer_of[target] >= layer_of.get(module, 0):
                found.append(
                    f"{module} (layer {layer_of.get(module)}) imports {target} (layer {layer_of[target]})"
                )
    return found


def _graph() -> dict[str, set[str]]:
    paths: dict[str, Path] = {module_name(path): path for path in modules(PACKAGE)}
    known = set(paths)
    return {name: _imports(imported_names(path), known) for name, path in paths.items()}


def test_every_module_is_in_exactly_one_layer() -> None:
    listed = [name for layer in LAYERS for name in layer]
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert set(listed) == set(_graph()), "modules missing from LAYERS (or listed but gone)"


def test_modules_import_only_lower_layers() -> None:
    assert violations(_graph(), LAYERS) == []


def test_the_docs_list_the_same_layers() -> None:
    text = (REPO / "docs" / "collectives.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    documented: dict[int, list[str]] = defaultdict(list)
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if row.startswith("|") and cells[0].isdigit():
            name = cells[1].strip("`")
            documented[int(cells[0])].append(PACKAGE if name == PACKAGE else f"{PACKAGE}.{name}")
    assert [documented[index + 1] for index in range(len(documented))] == LAYERS


def test_the_worker_library_never_imports_the_launcher() -> None:
    found = [
        f"{module_name(path)}:{line} imports {name}"
        for path in modules(PACKAGE)
        for line, name in imported_names(path)
        if name == "launcher" or name.startswith("launcher.")
    ]
    assert found == []


def test_the_checker_catches_back_and_sideways_edges() -> None:
    layers = [["low"], ["mid", "side"], ["high"]]
    graph = {"low": {"high"}, "mid": {"low", "side"}, "side": set(), "high": {"mid", "low"}}
    assert violations(graph, layers) == [
        "low (layer 1) imports high (layer 3)",
        "mid (layer 2) imports side (layer 2)",
    ]


def test_a_from_import_of_a_submodule_is_an_import_of_the_submodule_only() -> None:
    known = {"pkg", "pkg.mod"}
    assert _imports([(1, "pkg"), (1, "pkg.mod")], known) == {"pkg.mod"}
    assert _imports([(1, "pkg"), (1, "pkg.mod"), (1, "pkg.name")], known) == {"pkg", "pkg.mod"}
    assert _imports([(3, "pkg")], known) == {"pkg"}
