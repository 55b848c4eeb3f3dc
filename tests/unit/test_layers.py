"""launcher/'s packages form layers that import one way: each imports only the layers below it.

The order is docs/backend.md's ("Layers"); every import counts, lazy and `TYPE_CHECKING` ones included. The
shipped agent is at the bottom (it imports nothing of ours but itself), the CLI and the entry point at the
top, and the launcher never imports the worker library (`collectives`).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.layering import (
    REPO,
    imported_names,
    imported_units,
    layer_violations,
    module_name,
    modules,
    package_imports,
)

# Bottom first. A unit is a package (`launcher.core`) or a top-level module (`launcher.errors`); `launcher` is
# the package's own __init__ (the start guard, the version), which everything above it may use. The shipped
# agent is below it: on a remote host that __init__ is not there.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("launcher.agent",),
    ("launcher",),
    ("launcher.errors",),
    ("launcher.core",),
    ("launcher.signals",),
    ("launcher.console",),
    ("launcher.backends",),
    ("launcher.runtime",),
    ("launcher.diagnose",),
    ("launcher.report",),
    ("launcher.workdir",),
    ("launcher.check",),
    ("launcher.job",),
    ("launcher.cli",),
    ("launcher.entry",),
    ("launcher.__main__",),
)
FORBIDDEN = ("collectives",)


def test_every_launcher_import_goes_down_the_layers() -> None:
    assert layer_violations(LAYERS, package_imports("launcher"), FORBIDDEN) == []


def test_every_launcher_package_is_in_a_layer() -> None:
    top = {module_name(p).split(".")[1] for p in modules("launcher") if p.parent != REPO / "launcher"}
    listed = {unit.split(".")[1] for layer in LAYERS for unit in layer if "." in unit}
    assert top <= listed


def test_the_checker_catches_an_import_up_sideways_forbidden_or_unlisted() -> None:
    layers = (("p.low",), ("p.mid", "p.side"), ("p.high",))
    imports = {
        "p.low.a": [(3, "p.high.b.thing")],  # up: lazy or not, the walker yields it alike
        "p.mid.a": [(4, "p.side.c"), (5, "p.low.a"), (6, "p.mid.other")],  # sideways, down, own unit
        "p.high.b": [(7, "collectives.placement")],
        "p.lost": [(1, "p.low")],
    }
    assert layer_violations(layers, imports, ("collectives",)) == [
        "p.high.b:7 imports collectives.placement, a package it must never import",
        "p.lost: in no layer",
        "p.low.a:3 imports p.high (layer 3, not below p.low's)",
        "p.mid.a:4 imports p.side (layer 2, not below p.mid's)",
    ]


def test_a_from_import_of_a_submodule_unit_imports_that_unit_only() -> None:
    units = {"pkg", "pkg.mod"}
    assert imported_units([(1, "pkg"), (1, "pkg.mod")], units) == {(1, "pkg.mod")}
    assert imported_units([(1, "pkg"), (1, "pkg.mod"), (1, "pkg.name")], units) == {
        (1, "pkg"),
        (1, "pkg.mod"),
    }
    assert imported_units([(3, "pkg")], units) == {(3, "pkg")}


def test_the_walker_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "launcher" / "core" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from launcher.job.run import Job\n"
        "def f():\n"
        "    from ..report import summary\n"
    )
    names = [name for _, name in imported_names(source, tmp_path)]
    assert {"launcher.job.run.Job", "launcher.report.summary"} <= set(names)


def test_docs_backend_md_states_the_same_layer_order() -> None:
    text = (REPO / "docs" / "backend.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    stated = re.findall(r"^\d+\. (.+)$", section, flags=re.M)
    expected = [", ".join(f"`{unit}`" for unit in layer) for layer in LAYERS]
    assert [line.split(":")[0].strip() for line in stated] == expected
