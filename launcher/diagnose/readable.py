"""A thread's frames as a person reads them on the console (pure): C++ template arguments shortened, runs of
frames from the standard library and installed packages folded into one line that names the packages, and a
very deep stack cut in its middle with a mark saying what was left out. The frames the verdict names and
the innermost frame are always shown whole; `--output-dir` and the report keep every frame as read.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from launcher.core.plan import plural

# Where a frame's file says it is not the user's own code: the interpreter's library or installed packages.
LIBRARY_PATHS = ("/lib/python", "site-packages/", "dist-packages/", "<frozen ")
_PACKAGE_DIRS = ("site-packages/", "dist-packages/")
# A run of at least this many library frames becomes one line.
FOLD_AT = 3
# A stack longer than this many lines (after folding) keeps its outermost and innermost ones.
MOST_LINES = 40
OUTERMOST = 10
INNERMOST = 25
# A native symbol longer than this after its template arguments are shortened keeps its two ends.
SYMBOL_LIMIT = 160
# Operators whose angle brackets are no template's.
_OPERATORS = re.compile(r"operator(<<=|>>=|<=>|<<|>>|<=|>=|->\*|->|<|>)")


def is_library(file: str) -> bool:
    return any(p in file for p in LIBRARY_PATHS)


def package_of(file: str) -> str:
    """The top-level package or standard module a library file belongs to: `pytest`, `threading`."""
    for marker in _PACKAGE_DIRS:
        if marker in file:
            top = file.split(marker, 1)[1].split("/", 1)[0]
            # `_pytest` is pytest's code, as people call it.
            return posixpath.splitext(top)[0].lstrip("_") or top
    if file.startswith("<frozen "):
        return file[len("<frozen ") :].rstrip(">").split(".", 1)[0]
    if "/lib/python" in file:
        parts = file.split("/lib/python", 1)[1].split("/")
        if len(parts) > 1:
            return posixpath.splitext(parts[1])[0]
    return posixpath.basename(file)


def _collapse(text: str, opening: str, closing: str) -> str:
    """Every outermost `<...>` (or `(...)`) with contents replaced by `<...>` (`()` stays); unbalanced text is
    kept as it is."""
    out: list[str] = []
    depth = 0
    inner = 0
    for char in text:
        if char == opening:
            if depth == 0:
                out.append(opening)
                inner = 0
            else:
                inner += 1
            depth += 1
        elif char == closing and depth:
            depth -= 1
            if depth == 0:
                out.append(("..." if inner else "") + closing)
            else:
                inner += 1
        elif depth == 0:
            out.append(char)
        else:
            inner += 1
    return text if depth else "".join(out)


def shorten_symbol(name: str, limit: int = SYMBOL_LIMIT) -> str:
    """A native (C++) function name without its template arguments and parameter lists:
    `pybind11::cpp_function::initialize<...>(...)::{lambda(...)#3}::_FUN`."""
    operators: list[str] = []

    def hide(match: re.Match[str]) -> str:
        operators.append(match[0])
        return f"\0{len(operators) - 1}\0"

    short = _OPERATORS.sub(hide, name)
    # Parentheses first: a template argument may hold `(a > b)`.
    short = _collapse(_collapse(short, "(", ")"), "<", ">")
    short = re.sub(r"\0(\d+)\0", lambda m: operators[int(m[1])], short)
    if len(short) > limit:
        half = (limit - 3) // 2
        short = f"{short[:half]}...{short[-half:]}"
    return short


@dataclass(frozen=True)
class Shown:
    """One line of a thread's stack on the console: a frame (its index in the thread) or a mark."""

    frame: int | None = None
    mark: str = ""


def _fold_text(count: int, packages: Sequence[str]) -> str:
    names = list(dict.fromkeys(packages))
    listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"... {plural(count, 'frame', 'frames')} in {listed}"


def _elided_text(count: int, funcs: Sequence[str]) -> str:
    common = [name for name, _ in Counter(funcs).most_common(2)]
    return f"... {plural(count, 'frame', 'frames')} not shown (in {', '.join(common)})"


def readable(
    files: Sequence[str], funcs: Sequence[str], native: Sequence[bool], keep: Collection[int] = ()
) -> list[Shown]:
    """The lines for a thread whose frames (outermost first) have these files, functions and nativeness.

    `keep`: indices always shown (the verdict's frames); the innermost frame always is too.
    """
    count = len(files)
    keep = {*keep, count - 1}
    library = [not native[i] and is_library(files[i]) and i not in keep for i in range(count)]
    lines: list[Shown] = []
    folded: list[list[int]] = []  # for each line, the frames it stands for
    i = 0
    while i < count:
        j = i
        while j < count and library[j]:
            j += 1
        if j - i >= FOLD_AT:
            lines.append(Shown(mark=_fold_text(j - i, [package_of(files[k]) for k in range(i, j)])))
            folded.append(list(range(i, j)))
            i = j
            continue
        end = max(j, i + 1)
        for k in range(i, end):
            lines.append(Shown(frame=k))
            folded.append([k])
        i = end
    if len(lines) <= MOST_LINES:
        return lines
    # Keep the outermost and innermost lines and those of kept frames; each gap becomes one mark.
    shown = set(range(OUTERMOST)) | set(range(len(lines) - INNERMOST, len(lines)))
    shown |= {n for n, line in enumerate(lines) if line.frame in keep}
    out: list[Shown] = []
    gap: list[int] = []
    for n, line in enumerate(lines):
        if n in shown:
            if gap:
                out.append(Shown(mark=_elided_text(len(gap), [funcs[k] for k in gap])))
                gap = []
            out.append(line)
        else:
            gap.extend(folded[n])
    if gap:
        out.append(Shown(mark=_elided_text(len(gap), [funcs[k] for k in gap])))
    return out
