"""What an agent keeps between launches on its host: the compiled agent code and the ranks' software."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.agent.cache_root import default_root
from launcher.agent.software import software_of
from launcher.backends.bootstrap import SHIPPED, bootstrap_args, shipped_sources


@pytest.fixture
def python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An interpreter that counts its starts, whose path is its own fake site (a fake torch) and the standard
    library: this machine's site-packages (a real torch, NCCL) and user site stay out of it (-s -S)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text("__version__ = '9.9.0'\ncuda = None\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho x >> {tmp_path / "starts"}\nexec {sys.executable} -s -S "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(site))
    return wrapper


def starts(python: Path) -> int:
    counted = python.parent / "starts"
    return len(counted.read_text().splitlines()) if counted.exists() else 0


def test_software_is_asked_once_then_kept_while_nothing_changed(python: Path, tmp_path: Path) -> None:
    root = str(tmp_path / "cache")
    first = software_of(str(python), root)
    assert first["torch"] == "9.9.0" and first["python"] == ".".join(map(str, sys.version_info[:3]))
    assert software_of(str(python), root) == first
    assert starts(python) == 1


def test_software_is_asked_again_after_an_upgrade(python: Path, tmp_path: Path) -> None:
    root = str(tmp_path / "cache")
    assert software_of(str(python), root)["torch"] == "9.9.0"
    version = tmp_path / "site" / "torch" / "version.py"
    version.write_text("__version__ = '9.10.0'\ncuda = None\n")  # size differs whatever the clock says
    assert software_of(str(python), root)["torch"] == "9.10.0"
    assert starts(python) == 2


def test_software_is_asked_again_when_a_package_appears_on_the_path(python: Path, tmp_path: Path) -> None:
    root = str(tmp_path / "cache")
    assert software_of(str(python), root)["nccl"] == ""
    (tmp_path / "site" / "nvidia_nccl_cu12-2.27.3.dist-info").mkdir()
    os.utime(tmp_path / "site", ns=(1, 1))  # a new entry, even within the clock's resolution
    assert software_of(str(python), root)["nccl"] == "2.27.3"


def test_a_damaged_software_cache_is_asked_again(python: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    software_of(str(python), str(root))
    for kept in (root / "software").iterdir():
        kept.write_text("{not json")
    assert software_of(str(python), str(root))["torch"] == "9.9.0"
    assert starts(python) == 2


def test_software_without_a_cache_directory_still_answers(python: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert software_of(str(python), str(blocked / "cache"))["torch"] == "9.9.0"


def run_bootstrap(
    cache: Path, sources: list[bytes], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The shipped modules loaded as on a remote host; the agent's main() replaced by a print."""
    args = bootstrap_args(sources)
    shown = (
        "m=__import__('launcher.agent.server',fromlist=['main']);"
        "print(m.__name__, m.main.__code__.co_filename, getattr(m, 'CHANGED', 0), *sorted(sys.modules))"
    )
    assert "sys.exit(m.main())" in args[3]
    args[3] = args[3].replace("sys.exit(m.main())", shown)
    if env is None:
        env = {**os.environ, "DISTRUN_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, *args], input=b"".join(sources), capture_output=True, env=env, timeout=60
    )


def test_agent_code_is_compiled_once_per_source(tmp_path: Path) -> None:
    sources = shipped_sources()
    first = run_bootstrap(tmp_path, sources)
    assert first.returncode == 0, first.stderr.decode()
    name, filename, changed, *modules = first.stdout.decode().split()
    assert [name, filename, changed] == ["launcher.agent.server", "distrun-agent.server", "0"]
    # Only what the agent ran is compiled and kept: the modules of features no job asked for yet stay source.
    ran = {m for m in modules if m.startswith("launcher.agent.")}
    assert "launcher.agent.protocol" in ran and "launcher.agent.elastic" not in ran
    methods = f"dataclass-methods-agent-{importlib.util.MAGIC_NUMBER.hex()}"  # the records' (below)
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "code").iterdir() if p.name != methods)
    assert kept == sorted(name.removeprefix("launcher.") for name in ran)
    # A kept file is what runs: damage one and the host falls back to the source it was sent.
    agent_code = next((tmp_path / "code").glob("agent.server-*"))
    agent_code.write_bytes(b"garbage")
    again = run_bootstrap(tmp_path, sources)
    assert again.returncode == 0, again.stderr.decode()
    # A changed source is another name: the old code is never run for it.
    server = SHIPPED.index("launcher.agent.server")
    changed = [*sources[:server], sources[server] + b"\nCHANGED = 1\n", *sources[server + 1 :]]
    third = run_bootstrap(tmp_path, changed)
    assert third.stdout.decode().split()[:3] == ["launcher.agent.server", "distrun-agent.server", "1"], (
        third.stderr.decode()
    )
    assert len(list((tmp_path / "code").glob("agent.server-*"))) == 2


def test_agent_code_is_not_kept_where_others_could_write(tmp_path: Path) -> None:
    shared = tmp_path / "code"
    shared.mkdir()
    shared.chmod(0o777)
    ran = run_bootstrap(tmp_path, shipped_sources())
    assert ran.returncode == 0, ran.stderr.decode()
    assert list(shared.iterdir()) == []


@pytest.mark.parametrize("xdg", [True, False], ids=["XDG_CACHE_HOME", "HOME"])
def test_agent_code_lies_under_the_agents_cache_root(
    xdg: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISTRUN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    else:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    ran = run_bootstrap(tmp_path, shipped_sources(), env=dict(os.environ))
    assert ran.returncode == 0, ran.stderr.decode()
    code = Path(default_root()) / "code"
    assert code.is_relative_to(tmp_path)
    assert len(list(code.glob("agent.server-*"))) == 1


def test_the_agents_record_methods_are_compiled_once(tmp_path: Path) -> None:
    """The protocol's records' methods (launcher.agent.dataclass_code) are kept beside the agent's code: a
    second start on the host reads them, compiles nothing and so writes nothing."""
    kept = tmp_path / "code" / f"dataclass-methods-agent-{importlib.util.MAGIC_NUMBER.hex()}"
    first = run_bootstrap(tmp_path, shipped_sources())
    assert first.returncode == 0, first.stderr.decode()
    assert kept.is_file()
    written = kept.stat().st_mtime_ns
    second = run_bootstrap(tmp_path, shipped_sources())
    assert second.returncode == 0, second.stderr.decode()
    assert kept.stat().st_mtime_ns == written
