"""`distrun top`, `distrun stacks`, then Ctrl-C or `--timeout`, in each phase of an elastic reset on local
ranks (tests/reset_matrix.py); tests/multihost/test_reset_matrix_ssh.py is the same on SSH hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reset_matrix import ENDINGS, PHASES, reset_cell
from tests.support import assert_all_gone, clean_env


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("phase", PHASES)
def test_tools_in_each_phase_of_a_reset(phase: str, ending: str, tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    out = tmp_path / "out"
    out.mkdir()
    _, pids = reset_cell(phase, ending, "localhost:3", clean_env(XDG_RUNTIME_DIR=str(runtime)), out)
    assert len(pids) == 3
    assert_all_gone(pids)
