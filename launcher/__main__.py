from __future__ import annotations

from launcher.entry import main

main()
