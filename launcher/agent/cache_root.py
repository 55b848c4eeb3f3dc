"""Where distrun keeps its caches on a host, per user: the workdir store, the agent's compiled code.

Shipped with the agent (stdlib only, Python 3.7), and light enough for the launcher's first instructions.
"""

from __future__ import annotations

import os

CACHE_DIR_VAR = "DISTRUN_CACHE_DIR"


def default_root() -> str:
    """$DISTRUN_CACHE_DIR, else $XDG_CACHE_HOME/distrun, else ~/.cache/distrun: per user, per host."""
    given = os.environ.get(CACHE_DIR_VAR)
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "distrun")


def private_code_dir() -> str | None:
    """<root>/code, made if missing, or None where it is not this user's alone: code read from a directory
    someone else can write to would be theirs to choose. The shipped bootstrap restates this (it runs before
    any module exists; tests/integration/test_agent_caches.py holds the two to one directory)."""
    path = os.path.join(default_root(), "code")
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path
