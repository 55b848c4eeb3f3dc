"""What the bootstrap ships is the agent's folder, and it runs on a real interpreter as a host has it: the
one running the tests, and the oldest Python that README says a host needs where this machine has one."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.agent import OLDEST_PYTHON
from launcher.agent.protocol import (
    DONE,
    EXIT,
    FACTS,
    OUT,
    PROBE,
    START,
    VERSION,
    Facts,
    FrameReader,
    ProbeRequest,
    RankExited,
    RankSpec,
    StartRequest,
    decode_message,
    encode_message,
)
from launcher.backends import bootstrap
from launcher.backends.bootstrap import TOO_OLD, bootstrap_args, shipped_modules, shipped_sources
from tests.support import read_frames_until, start_shipped_agent

# Sorts first in the folder, yet must run after the protocol module it imports.
ADDED = """
from __future__ import annotations

import sys

from launcher.agent.protocol import VERSION


def main() -> int:
    from launcher.agent.elastic_messages import Notice  # a shipped module, run at its first import

    ran = sorted(name for name in sys.modules if name.startswith("launcher."))
    print(VERSION, Notice.__name__, " ".join(ran))
    return 0
"""


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def installed_python(version: tuple[int, int]) -> str | None:
    """The executable of an interpreter of `version` among pyenv's or on PATH, if this machine has one (a
    pyenv shim on PATH is asked which executable it runs: the agent runs without pyenv's environment)."""
    name = f"python{dotted(version)}"
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for candidate in [*sorted(glob.glob(f"{root}/versions/*/bin/{name}")), shutil.which(name)]:
        if candidate is None:
            continue
        try:
            said = subprocess.run(
                [candidate, "-c", "import sys; print(sys.executable, '%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                timeout=30,
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(said) == 2 and said[1].decode() == dotted(version):
            return said[0].decode()
    return None


def test_a_module_added_to_the_folder_is_shipped_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "agent"
    shutil.copytree(bootstrap.AGENT_DIR, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "aa_added.py").write_text(ADDED)
    shipped = shipped_modules(folder)
    assert set(shipped) == {*bootstrap.SHIPPED, "launcher.agent.aa_added"}
    assert shipped.index("launcher.agent.aa_added") > shipped.index("launcher.agent.protocol")

    monkeypatch.setattr(bootstrap, "AGENT_DIR", folder)
    monkeypatch.setattr(bootstrap, "SHIPPED", shipped)
    sources = shipped_sources()
    ran = subprocess.run(
        [sys.executable, *bootstrap_args(sources, entry="launcher.agent.aa_added")],
        input=b"".join(sources),
        capture_output=True,
        cwd="/",  # nothing of distrun importable: only what was shipped
        env={"PATH": os.environ.get("PATH", ""), "DISTRUN_CACHE_DIR": str(tmp_path / "cache")},
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr.decode()
    # Only what it imports runs (and the records' kept methods, which the bootstrap installs first): the rest
    # of the folder is shipped but stays source until some job needs it.
    ran_modules = [
        "launcher.agent",
        "launcher.agent.aa_added",
        "launcher.agent.dataclass_code",
        "launcher.agent.elastic_messages",
    ]
    assert ran.stdout.decode().split() == [
        str(VERSION),
        "Notice",
        *sorted([*ran_modules, "launcher.agent.protocol"]),
    ]


def test_the_shipped_agent_runs_on_the_oldest_python_hosts_need(tmp_path: Path) -> None:
    """A probe with every question (check, software) and one rank's start, on that interpreter."""
    python = installed_python(OLDEST_PYTHON)
    if python is None:
        pytest.skip(f"no Python {dotted(OLDEST_PYTHON)} on this machine")
    proc = start_shipped_agent(python, DISTRUN_CACHE_DIR=str(tmp_path))
    assert proc.stdin is not None
    probe = ProbeRequest(ports=1, cwd="/", check=True, software=True, python=python)
    rank = RankSpec(0, [python, "-c", "import sys; print(sys.version_info[:2])"], {})
    proc.stdin.write(encode_message(PROBE, probe, agent=1))
    proc.stdin.write(encode_message(START, StartRequest(cwd="/", grace=1.0, ranks=[rank]), agent=1))
    proc.stdin.flush()
    frames = read_frames_until(proc, FrameReader(after_magic=True), DONE)
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    facts = decode_message(Facts, next(f.payload for f in frames if f.kind == FACTS))
    oldest = f"{dotted(OLDEST_PYTHON)}."
    assert facts.python_version.startswith(oldest) and (facts.software or {})["python"].startswith(oldest)
    assert b"".join(f.payload for f in frames if f.kind == OUT) == f"{OLDEST_PYTHON}\n".encode()
    exited = decode_message(RankExited, next(f.payload for f in frames if f.kind == EXIT))
    assert exited.returncode == 0


def test_an_older_python_says_what_the_agent_needs_in_one_line() -> None:
    older = (OLDEST_PYTHON[0], OLDEST_PYTHON[1] - 1)
    python = installed_python(older)
    if python is None:
        pytest.skip(f"no Python {dotted(older)} on this machine")
    sources = shipped_sources()
    ran = subprocess.run(
        [python, *bootstrap_args(sources)], input=b"".join(sources), capture_output=True, cwd="/", timeout=60
    )
    said = ran.stderr.decode()
    assert ran.returncode == 1, said
    assert said.startswith(f"{TOO_OLD} {dotted(OLDEST_PYTHON)} or newer, not {dotted(older)}.")
    assert said.count("\n") == 1, said
