"""distrun's entry point (`distrun`, `python -m launcher`).

Ctrl-C is guarded from the package's first instruction (see `launcher/__init__.py`) while the CLI is imported,
which is a good part of distrun's start-up, until `launcher.cli.main` takes over inside its own try.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def without_gc() -> Iterator[None]:
    """For distrun's own imports: they allocate tens of thousands of objects and free almost none, and the
    collector's passes over them were ~5% of a no-op job's start-up."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def main() -> None:
    with without_gc():
        from launcher.cli.main import entry

    entry()


if __name__ == "__main__":
    main()
