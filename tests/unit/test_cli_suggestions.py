"""An option distrun does not have: one line and exit 2, with a "Did you mean" only for a near typo of one of
ours, never for another launcher's flag that merely shares letters with one (horovodrun's --gloo, --nics)."""

from __future__ import annotations

import pytest

from launcher.cli.main import main
from launcher.errors import EXIT_USAGE


@pytest.fixture(autouse=True)
def no_distrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own DISTRUN_* settings, or a Slurm job the tests run in, must not leak into them."""
    import os

    for name in [n for n in os.environ if n.startswith(("DISTRUN_", "SLURM_"))]:
        monkeypatch.delenv(name)


def usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    assert (info.value.code, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "args",
    [
        ("--gloo", "train.py"),
        ("--mpi-args", "-x", "train.py"),
        ("--nics", "eth0", "train.py"),
        ("check", "--gloo"),
    ],
)
def test_horovodrun_flags_get_no_suggestion(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    flag = next(a for a in args if a.startswith("--"))
    assert usage_error(capsys, *args) == f"distrun: error: No such option '{flag}'.\n"


def test_a_near_typo_still_gets_its_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, "--hostfle", "hosts.txt", "train.py") == (
        "distrun: error: No such option '--hostfle'. Did you mean '--hostfile'?\n"
    )
