"""distrun's entry point (`distrun`, `python -m launcher`).

Ctrl-C is guarded from the package's first instruction (see `launcher/__init__.py`) while the CLI is imported,
which is a good part of distrun's start-up; then the CLI's own handling takes over.
"""

from __future__ import annotations

from launcher import release_start_guard


def main() -> None:
    from launcher.cli import main as cli_main

    release_start_guard()
    cli_main()


if __name__ == "__main__":
    main()
