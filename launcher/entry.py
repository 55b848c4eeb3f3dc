"""distrun's entry point (`distrun`, `python -m launcher`).

Ctrl-C is guarded from the package's first instruction (see `launcher/__init__.py`) while the CLI is imported,
which is a good part of distrun's start-up, until `launcher.cli.main` takes over inside its own try.
"""

from __future__ import annotations

from launcher import without_gc


def main() -> None:
    with without_gc():
        from launcher.cli.main import entry

    entry()


if __name__ == "__main__":
    main()
