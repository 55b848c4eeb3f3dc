"""distrun's entry point (`distrun`, `python -m launcher`).

Ctrl-C is guarded from the package's first instruction (see `launcher/__init__.py`) while the CLI is imported,
which is a good part of distrun's start-up, until `launcher.cli` takes over inside its own try.
"""

from __future__ import annotations


def main() -> None:
    from launcher.cli import entry

    entry()


if __name__ == "__main__":
    main()
