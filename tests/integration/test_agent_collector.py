"""An agent imports its modules without the garbage collector (its passes over them were ~10 ms of every
agent's start) and runs with it, what it imported left out of its passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.backends.bootstrap import bootstrap_args, local_argv, shipped_sources

COLLECTIONS = "print(gc.get_stats()[0]['collections'], end=' ')"
# In place of the agent's main(): its collector, and whether a pass would walk the server's functions.
SHOWN = (
    f"{COLLECTIONS};print(gc.isenabled(), "
    "any(o is sys.modules['launcher.agent.server'].serve for o in gc.get_objects()))"
)


def _run(argv: list[str], code: str, stdin: bytes, env: dict[str, str]) -> str:
    argv = [*argv]
    argv[argv.index("-c") + 1] = code
    done = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().strip()


def _shown(argv: list[str], main_call: str, stdin: bytes, env: dict[str, str]) -> tuple[str, str]:
    """What the agent shows in place of its main(), and the young collections its interpreter had run
    when the bootstrap turned the collector off."""
    code = argv[argv.index("-c") + 1]
    assert main_call in code
    off = code[: code.index("gc.disable()") + len("gc.disable()")]
    shown = _run(argv, code.replace(main_call, SHOWN), stdin, env)
    return shown, _run(argv, f"{off}\n{COLLECTIONS}", b"", env)


def test_a_shipped_agent_imports_without_the_collector_then_runs_with_it(tmp_path: Path) -> None:
    sources = shipped_sources()
    argv = [sys.executable, *bootstrap_args(sources)]
    env = {**os.environ, "DISTRUN_CACHE_DIR": str(tmp_path)}
    shown, before = _shown(argv, "sys.exit(m.main())", b"".join(sources), env)
    assert shown == f"{before} True False"


def test_a_local_agent_interpreter_imports_without_the_collector_then_runs_with_it() -> None:
    shown, before = _shown(local_argv(sys.executable), "sys.exit(main())", b"", dict(os.environ))
    assert shown == f"{before} True False"
