"""The layers of `collectives`, bottom first: a module imports only modules of lower layers, never one beside
it or above it, so the package's import graph stays a DAG. The worker library never imports the launcher.
The checker (tests/layering.py) is the one tests/unit/test_layers.py holds launcher/ to, with its samples.

docs/collectives.md ("Modules") lists the same order, one line a module.
"""

from __future__ import annotations

from collections import defaultdict

from tests.layering import REPO, layer_violations, package_imports

LAYERS: list[list[str]] = [
    # Values and leaf helpers: they import nothing of ours.
    [
        "collectives.errors",
        "collectives.reduce_op",
        "collectives.leaving",
        "collectives.collector",
        "collectives.compression",
        "collectives.buckets",
        "collectives.features",
        "collectives.registry",
        "collectives.engine_values",
        "collectives.engine_cache",
        "collectives.engine_pace",
        "collectives.engine_lock",
        "collectives.engine_tickets",
        "collectives.progress",
        "collectives.elastic.failures",
        "collectives.elastic.joining",
    ],
    ["collectives.engine_announce"],
    [
        "collectives.links",
        "collectives.engine_rounds",
        "collectives.placement",
        "collectives.negotiation",
        "collectives.engine_reports",
        "collectives.grad_buckets",
        "collectives.optimizer_args",
        "collectives.peer_loss",
    ],
    ["collectives.context", "collectives.engine_entries", "collectives.elastic.channel"],
    ["collectives.engine"],
    ["collectives.engines"],
    [
        "collectives.process_sets",
        "collectives.data",
        "collectives.ops._common",
        "collectives.ops._handle",
        "collectives.sync_batch_norm",
    ],
    [
        "collectives.objects",
        "collectives.coordination",
        "collectives.startup",
        "collectives.ops._allreduce",
        "collectives.ops._grouped_allreduce",
        "collectives.ops._alltoall",
    ],
    [
        "collectives.checkpoint",
        "collectives.ops._allgather",
        "collectives.ops._broadcast",
        "collectives.step_agreement",
    ],
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


def _graph() -> dict[str, list[tuple[int, str]]]:
    return package_imports(PACKAGE)


def test_every_module_is_in_exactly_one_layer() -> None:
    listed = [name for layer in LAYERS for name in layer]
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert set(listed) == set(_graph()), "modules missing from LAYERS (or listed but gone)"


def test_modules_import_only_lower_layers() -> None:
    assert layer_violations(LAYERS, _graph(), ("launcher",)) == []


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
