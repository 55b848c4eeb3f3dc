"""`distrun check` takes only the options that apply to it, and reads the launch's --config file as it is."""

from __future__ import annotations

from pathlib import Path

from tests.support import run_distrun


def test_check_reads_a_launch_config_file_and_passes_over_what_only_a_launch_uses(tmp_path: Path) -> None:
    config = tmp_path / "distrun.yaml"
    config.write_text("num-proc: 1\nprefix: host\nmax-restarts: 2\nssh-connect-timeout: 3\n")
    done = run_distrun("check", "--config", config, timeout=180)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode() + out
    assert "localhost" in out and "unknown option" not in done.stderr.decode()


def test_a_launch_only_option_is_no_option_of_check() -> None:
    done = run_distrun("check", "--prefix", "host")
    assert done.returncode == 2
    assert b"No such option '--prefix'" in done.stderr
