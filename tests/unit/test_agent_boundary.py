"""The shipped agent's boundary: what `launcher/agent/` may import and which Python its code must run on.

Hosts get the folder's modules as source and nothing else (no distrun install, no site-packages: the bootstrap
runs with -S), on whatever interpreter they have; README says which they need at least (OLDEST_PYTHON).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.agent import OLDEST_PYTHON, protocol
from launcher.agent.protocol import ELSEWHERE, MESSAGES, SAMPLES, Frame, decode_frame, message_type
from launcher.backends.bootstrap import AGENT_DIR, SHIPPED
from tests.support import REPO

MODULES = sorted(AGENT_DIR.glob("*.py"))
SHIPPED_NAMES = {path.stem for path in MODULES if path.name != "__init__.py"}
# Standard modules that the oldest Python lacks (sys.stdlib_module_names is this interpreter's list).
NEWER_MODULES = {
    "graphlib": (3, 9),
    "importlib.metadata": (3, 8),
    "tomllib": (3, 11),
    "zoneinfo": (3, 9),
}
# Module attributes newer than 3.7, as `module.name` or `from module import name`.
NEWER_NAMES = {
    "contextlib.chdir": (3, 11),
    "functools.cache": (3, 9),
    "functools.cached_property": (3, 8),
    "itertools.pairwise": (3, 10),
    "math.prod": (3, 8),
    "os.pidfd_open": (3, 9),
    "os.waitstatus_to_exitcode": (3, 9),
    "random.randbytes": (3, 9),
    "shlex.join": (3, 8),
    "signal.pidfd_send_signal": (3, 9),
    "signal.raise_signal": (3, 8),
    "signal.strsignal": (3, 8),
    "signal.valid_signals": (3, 8),
    "socket.create_server": (3, 8),
    "sys.stdlib_module_names": (3, 10),
    "threading.get_native_id": (3, 8),
    "typing.Final": (3, 8),
    "typing.Literal": (3, 8),
    "typing.Protocol": (3, 8),
    "typing.TypedDict": (3, 8),
}
# Methods newer than 3.7 on any object (str, int, Path): their names are distinctive enough to flag anywhere.
NEWER_METHODS = {
    "bit_count": (3, 10),
    "is_relative_to": (3, 9),
    "removeprefix": (3, 9),
    "removesuffix": (3, 9),
    "with_stem": (3, 9),
}
# Keyword arguments newer than 3.7 (Popen's, dataclass's, zip's, Path.unlink's, copytree's, hashlib's).
NEWER_KEYWORDS = {
    "dirs_exist_ok": (3, 8),
    "extra_groups": (3, 9),
    "kw_only": (3, 10),
    "missing_ok": (3, 8),
    "pipesize": (3, 10),
    "process_group": (3, 11),
    "slots": (3, 10),
    "strict": (3, 10),
    "usedforsecurity": (3, 9),
}
# Built-in types whose `[...]` (3.9) or `|` (3.10) outside an annotation is evaluated when the code runs.
TYPES = {
    "bool",
    "bytes",
    "dict",
    "float",
    "frozenset",
    "int",
    "list",
    "object",
    "set",
    "str",
    "tuple",
    "type",
}


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation (`from __future__ import annotations` keeps them text)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        roots: list[ast.expr | None] = []
        if isinstance(node, ast.arg):
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        for root in roots:
            if root is not None:
                inside.update(id(n) for n in ast.walk(root))
    return inside


def _imported(node: ast.AST) -> Iterator[str]:
    """The modules an import statement (or a constant `__import__`/`import_module` call) names."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        yield "." * node.level + (node.module or "")
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        callee = node.func
        name = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", "")
        if name in ("__import__", "import_module") and isinstance(node.args[0].value, str):
            yield node.args[0].value


def import_problems(source: str) -> list[str]:
    """Imports, at any depth, of anything but the oldest Python's standard library and the agent's modules."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        for name in _imported(node):
            top = name.split(".")[0]
            if name.startswith("launcher.agent."):
                if name.split(".")[2] not in SHIPPED_NAMES:
                    problems.append(f"line {node.lineno}: {name}: no such module in launcher/agent/")
            elif top not in sys.stdlib_module_names:
                problems.append(f"line {node.lineno}: {name or '.'}: neither standard nor launcher.agent")
            elif any(name == m or name.startswith(m + ".") for m in NEWER_MODULES):
                problems.append(f"line {node.lineno}: {name}: not in Python {_shown(OLDEST_PYTHON)}")
    return problems


def syntax_problems(source: str) -> list[str]:
    """What the oldest Python cannot parse or run: newer syntax, and newer library names and keywords."""
    try:
        tree = ast.parse(source, feature_version=OLDEST_PYTHON)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: {exc.msg}"]
    problems = []
    in_annotation = _annotations(tree)
    has_future = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if in_annotation and not has_future:
        problems.append("annotations without `from __future__ import annotations` are evaluated at import")
    imported = {
        a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                newer = NEWER_NAMES.get(f"{node.module}.{alias.name}")
                if newer:
                    problems.append(f"{where}: {node.module}.{alias.name} is Python {_shown(newer)}")
        elif isinstance(node, ast.Attribute):
            base = imported.get(node.value.id, "") if isinstance(node.value, ast.Name) else ""
            newer = NEWER_NAMES.get(f"{base}.{node.attr}") or NEWER_METHODS.get(node.attr)
            if newer:
                problems.append(f"{where}: .{node.attr} is Python {_shown(newer)}")
        elif isinstance(node, ast.keyword) and node.arg in NEWER_KEYWORDS:
            problems.append(f"{where}: {node.arg}= is Python {_shown(NEWER_KEYWORDS[node.arg])}")
        elif id(node) in in_annotation:
            continue
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in TYPES:
            problems.append(f"{where}: {node.value.id}[...] outside an annotation is Python 3.9")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and _is_type_union(node):
            problems.append(f"{where}: `X | Y` of types outside an annotation is Python 3.10")
    return problems


def _is_type_union(node: ast.BinOp) -> bool:
    """`int | None`, `str | list[str]`: a side is None or a built-in type (`flags | os.O_CLOEXEC` is not)."""
    for side in (node.left, node.right):
        if isinstance(side, ast.Constant) and side.value is None:
            return True
        named = side.value if isinstance(side, ast.Subscript) else side
        if isinstance(named, ast.Name) and named.id in TYPES:
            return True
    return False


def _shown(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_the_agent_imports_only_the_standard_library_and_itself(path: Path) -> None:
    assert import_problems(path.read_text()) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_the_agent_runs_on_the_oldest_python_hosts_need(path: Path) -> None:
    assert syntax_problems(path.read_text()) == []


def test_agent_modules_import_each_other_as_the_bootstrap_orders_them() -> None:
    """The bootstrap runs the modules in SHIPPED's order, read from their top-level `from launcher.agent.X
    import` lines: another spelling at the top (`import launcher.agent.x`, `from launcher.agent import x`, a
    relative import) would run before what it needs."""
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("launcher") for a in node.names), (path.name, node.lineno)
            elif isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("launcher")):
                assert node.level == 0 and re.fullmatch(r"launcher\.agent\.\w+", node.module), (
                    path.name,
                    node.lineno,
                )
                assert SHIPPED.index(f"launcher.agent.{path.stem}") > SHIPPED.index(node.module), path.name


def test_agent_modules_import_a_lazy_message_type_from_where_it_lives() -> None:
    """On a host the protocol finds ELSEWHERE's types only among the modules the bootstrap already ran: an
    agent module taking one from `launcher.agent.protocol` at its top could run before that type's module."""
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module == "launcher.agent.protocol":
                assert not {a.name for a in node.names} & set(ELSEWHERE), (path.name, node.lineno)


def test_every_kind_s_message_type_is_found_and_the_lazy_ones_are_their_modules_own() -> None:
    for kind, name in MESSAGES.items():
        cls = message_type(kind)
        assert cls is not None and cls.__name__ == name and dataclasses.is_dataclass(cls), kind
    for name, module in ELSEWHERE.items():
        assert getattr(protocol, name) is getattr(importlib.import_module(f"launcher.agent.{module}"), name)
    samples = decode_frame(Frame(SAMPLES, 0, -1, b'{"interval": 2.0, "ranks": [{"rank": 3}]}'))
    assert samples == protocol.Samples(2.0, [protocol.RankSample(3)])
    with pytest.raises(AttributeError):
        protocol.NoSuchMessage  # noqa: B018


def test_readme_states_the_oldest_python_hosts_need() -> None:
    readme = (REPO / "README.md").read_text()
    hosts_need = readme[readme.index("Hosts need") :].split("\n\n")[0]
    assert f"Python {_shown(OLDEST_PYTHON)} or newer for distrun's agent" in " ".join(hosts_need.split())


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("import torch", "torch: neither standard nor launcher.agent"),
        ("def f():\n    import yaml", "yaml: neither standard nor launcher.agent"),
        ("from launcher.core.env import rank_env", "launcher.core.env: neither standard nor launcher.agent"),
        ("from . import protocol", ".: neither standard nor launcher.agent"),
        ("from launcher.agent.nothing import x", "launcher.agent.nothing: no such module in launcher/agent/"),
        ("import zoneinfo", "zoneinfo: not in Python 3.7"),
        ("__import__('numpy')", "numpy: neither standard nor launcher.agent"),
    ],
)
def test_the_import_check_finds_what_a_host_lacks(source: str, problem: str) -> None:
    assert [p.split(": ", 1)[1] for p in import_problems(source)] == [problem]


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("if (n := 1):\n    pass", "assignment expressions are only supported in python 3.8"),
        ("def f(a, /):\n    pass", "positional-only parameters are only supported in python 3.8"),
        ("import shlex\nshlex.join([])", ".join is Python 3.8"),
        ("from functools import cache", "functools.cache is Python 3.9"),
        ("'x'.removeprefix('y')", ".removeprefix is Python 3.9"),
        ("import subprocess\nsubprocess.Popen([], process_group=0)", "process_group= is Python 3.11"),
        ("Pair = tuple[int, int]", "tuple[...] outside an annotation is Python 3.9"),
        ("Maybe = int | None", "`X | Y` of types outside an annotation is Python 3.10"),
        ("def f(a: list[int] | None) -> None:\n    pass", "annotations without"),
    ],
)
def test_the_version_check_finds_what_the_oldest_python_lacks(source: str, problem: str) -> None:
    (found,) = syntax_problems(source)
    assert problem.lower() in found.lower()


def test_annotations_are_not_evaluated_under_the_future_import() -> None:
    source = "from __future__ import annotations\ndef f(a: list[int] | None) -> dict[str, int]:\n    pass\n"
    assert syntax_problems(source) == []
