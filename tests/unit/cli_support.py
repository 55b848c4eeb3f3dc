"""Shared by the unit tests of the command line: `main` run in-process, without the developer's settings."""

from __future__ import annotations

import os

import pytest

from launcher.cli.main import main


@pytest.fixture(autouse=True)
def no_distrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own DISTRUN_* settings, or a Slurm job the tests run in, must not leak into them.

    Autouse in every test module that imports it."""
    for name in [n for n in os.environ if n.startswith(("DISTRUN_", "SLURM_"))]:
        monkeypatch.delenv(name)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`distrun ARGS` in-process: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    assert isinstance(info.value.code, int)
    return info.value.code, out, err
