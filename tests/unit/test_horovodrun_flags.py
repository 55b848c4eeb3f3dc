"""Every flag of horovodrun's parser is accepted by distrun or explained, and the hidden ones do what
docs/usage.md says: aliases set their distrun option, tuning flags the engine honours set its HOROVOD_*
variable on every rank, the others say in one line what distrun does instead.

The flags are read from Horovod's own parser (horovod/runner/launch.py) where a checkout is at hand, else from
tests/data/horovodrun_flags.txt, derived from it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import click
import pytest

from launcher.cli.horovodrun import FLAGS, Kind
from launcher.cli.main import _parse, cli
from launcher.cli.request import Request

REPO = Path(__file__).resolve().parents[2]
# A Horovod checkout (HOROVOD_SRC) gives the flags of horovodrun's parser itself; else the list taken from it.
HOROVOD_LAUNCH = Path(os.environ.get("HOROVOD_SRC", "/nonexistent")) / "horovod" / "runner" / "launch.py"
# horovodrun's elastic flags: the elastic driver's own options (launcher's elastic work), not this table's.
ELASTIC = {"--slots-per-host", "--elastic-timeout", "--reset-limit", "--blacklist-cooldown-range"}


def horovodrun_flags() -> list[str]:
    if HOROVOD_LAUNCH.exists():
        source = HOROVOD_LAUNCH.read_text()
        return [
            name
            for call in re.finditer(r"add_argument\(((?:\s*'[^']*'\s*,)+)", source)
            for name in re.findall(r"'(-[^']+)'", call.group(1))
        ]
    lines = (REPO / "tests" / "data" / "horovodrun_flags.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _option_names() -> set[str]:
    return {name for p in cli.params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def test_every_horovodrun_flag_is_accepted_or_explained() -> None:
    flags = horovodrun_flags()
    assert len(flags) > 60
    names = _option_names()
    missing = [flag for flag in flags if flag not in names and flag not in ELASTIC]
    assert missing == []


def test_the_table_leaves_the_elastic_flags_to_the_elastic_driver() -> None:
    assert ELASTIC.isdisjoint(name for flag in FLAGS for name in flag.names)


def test_the_hidden_flags_collide_with_no_distrun_option() -> None:
    hidden = [name for flag in FLAGS for name in flag.names]
    visible = {name for p in cli.params if isinstance(p, click.Option) and not p.hidden for name in p.opts}
    assert len(hidden) == len(set(hidden))
    assert visible.isdisjoint(hidden)


def test_usage_md_maps_every_flag() -> None:
    usage = (REPO / "docs" / "usage.md").read_text()
    assert [flag for flag in horovodrun_flags() if f"`{flag}`" not in usage] == []


def test_aliases_and_tuning_flags_become_distrun_options_and_rank_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    request = _parse(
        [
            "-p", "2222", "--start-timeout", "77", "--output-filename", "out", "--log-level", "DEBUG",
            "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--no-stall-check",
            "--mpi-args", "--bind-to none", "--autotune", "-np", "2", "--dry-run", "true",
        ]
    )  # fmt: skip
    assert isinstance(request, Request)
    config = request.config
    assert config.startup_timeout == 77
    assert config.output_dir == Path("out")
    assert request.verbose == 1
    assert getattr(config.backend_options["ssh"], "port", None) == 2222
    exports = dict(config.exports)
    assert exports["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert exports["HOROVOD_CYCLE_TIME"] == "2.5"
    assert exports["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    err = capsys.readouterr().err
    assert "--mpi-args is not needed" in err and "--autotune has no effect" in err


def test_every_kind_is_used() -> None:
    assert {flag.kind for flag in FLAGS} == set(Kind)
