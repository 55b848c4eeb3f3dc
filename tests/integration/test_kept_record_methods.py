"""The `distrun` command keeps its records' compiled methods between runs
(launcher/agent/dataclass_code.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.support import clean_env, run_distrun

NOOP = (sys.executable, "-c", "pass")


def test_a_second_run_reads_the_code_the_first_compiled(tmp_path: Path) -> None:
    env = clean_env(DISTRUN_CACHE_DIR=str(tmp_path))
    kept = tmp_path / "code" / f"dataclass-methods-launcher-{importlib.util.MAGIC_NUMBER.hex()}"
    first = run_distrun("-np", "2", *NOOP, env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert kept.is_file()
    written = kept.stat().st_mtime_ns
    second = run_distrun("-np", "2", *NOOP, env=env)
    assert second.returncode == 0, second.stderr.decode()
    assert kept.stat().st_mtime_ns == written, "the second run compiled methods the first had kept"


def test_a_cache_others_can_write_to_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code").chmod(0o777)
    ran = run_distrun("-np", "2", *NOOP, env=clean_env(DISTRUN_CACHE_DIR=str(tmp_path)))
    assert ran.returncode == 0, ran.stderr.decode()
    assert list((tmp_path / "code").iterdir()) == []
