"""The code of dataclasses' generated methods, compiled once and kept between runs.

`dataclasses` writes each class's methods as source text (a frozen record gets six: `__init__`, `__repr__`,
`__eq__`, `__hash__`, `__setattr__`, `__delattr__`) and compiles it when the class is made. The launch path
makes ~64 records, and compiling their ~360 methods was ~40 % of its import time (70-90 ms here); the
protocol's 8 were ~12 ms of every shipped agent's start. The texts are the same on every run, so distrun
keeps the code compiled from each, by its text, in the per-user code cache beside the agent's compiled
modules: one file per program (the launcher's, the agent's) and bytecode version, marshalled as a .pyc
holds code. Nothing else changes: the classes are made by `dataclasses`, with exactly the code it would
compile (same text, same file name, no inherited `__future__` flags).

`dataclasses` runs its texts with the builtin `exec`; a module global of that name answers its calls alone.
Every failure (no cache directory, an unreadable or foreign file) falls back to compiling, as without it.
Shipped with the agent: stdlib only, Python 3.7.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import marshal
import os
import sys
from types import CodeType
from typing import Any

# Texts a file keeps at most: past it, a run keeps only the texts it used (the file only grows when the code,
# or the classes something imported into the process, change).
KEEP = 2048


class _Cache:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.codes: dict[str, CodeType] = _read(path) if path else {}
        self.used: set[str] = set()
        self.added = False
        self.pid = os.getpid()

    def exec(self, source: Any, globals: Any = None, locals: Any = None, **kw: Any) -> None:
        if type(source) is str:
            code = self.codes.get(source)
            if code is None:
                code = self.codes[source] = compile(source, "<string>", "exec", dont_inherit=True)
                self.added = True
            self.used.add(source)
            source = code
        builtins.exec(source, globals, locals, **kw)

    def save(self) -> None:
        """Write the file if this run compiled anything new; a forked child (which shares the table) never
        writes: its parent does."""
        if not self.added or self.path is None or self.pid != os.getpid():
            return
        codes = self.codes if len(self.codes) <= KEEP else {t: self.codes[t] for t in self.used}
        # The host's name too: on a home shared over NFS, two hosts' writers may have the same pid.
        temp = f"{self.path}.{os.uname().nodename}.{os.getpid()}"
        try:
            with open(temp, "wb") as f:
                f.write(marshal.dumps(codes))
            os.replace(temp, self.path)
        except (OSError, ValueError):  # a cache: the next run compiles again
            with contextlib.suppress(OSError):
                os.unlink(temp)
        self.added = False


def _read(path: str) -> dict[str, CodeType]:
    try:
        with open(path, "rb") as f:
            table = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {t: c for t, c in table.items() if type(t) is str and type(c) is CodeType}


_cache: _Cache | None = None


def file_name(program: str) -> str | None:
    """`program`'s file for this bytecode version (named as the agent's compiled modules are): code objects
    do not cross versions. None for an interpreter without CPython's importlib, which gets no cache."""
    bootstrap = sys.modules.get("_frozen_importlib_external")
    magic = getattr(bootstrap, "MAGIC_NUMBER", None)
    return f"dataclass-methods-{program}-{magic.hex()}" if isinstance(magic, bytes) else None


def install(folder: str | None, program: str) -> None:
    """From here on, dataclasses made in this process reuse the code kept in `folder` (the code cache,
    launcher.agent.cache_root.private_code_dir(); None: kept in memory only) for `program`."""
    global _cache
    if _cache is not None:
        return
    name = file_name(program)
    _cache = _Cache(os.path.join(folder, name) if folder and name else None)
    vars(dataclasses)["exec"] = _cache.exec


def save() -> None:
    """Keep what this run compiled (distrun calls it just before its exit, which skips `atexit`)."""
    if _cache is not None:
        _cache.save()


def uninstall() -> None:
    """Back to compiling every method (for tests)."""
    global _cache
    if _cache is not None and vars(dataclasses).get("exec") == _cache.exec:
        del vars(dataclasses)["exec"]
    _cache = None
