from __future__ import annotations

from launcher.cli import entry

entry()
