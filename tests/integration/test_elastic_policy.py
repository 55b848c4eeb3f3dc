"""The elastic policy on local ranks (docs/elastic.md, "The policy"): the round is decided once every rank
reported, whatever the spacing of the events. Every rank failing, together or seconds apart, ends the job at
that decision: no reset, no whole-job restart though --max-restarts allows one, no wait on --elastic-timeout.
Spaced apart, the later ranks raise after the agent's notice that a peer is gone: their own errors are still
their failures, not a lost peer's (collectives.elastic.failures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import SCRIPTS, clean_env, run_distrun

SCRIPT = SCRIPTS / "elastic_train.py"


@pytest.mark.parametrize("spacing", ["0", "1.5"], ids=["together", "seconds-apart"])
def test_every_rank_failing_ends_the_job_within_one_decision(tmp_path: Path, spacing: str) -> None:
    done = run_distrun(
        "-H", "localhost:3", "-np", "3", "--min-np", "2", "--max-restarts", "2", SCRIPT, tmp_path, "-1", "99",
        "5", env=clean_env(ELASTIC_FAIL_ALL_AT="2", ELASTIC_FAIL_SPACING_S=spacing), timeout=240,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "no reset in place: every rank of the world failed (3 ranks)" in err
    assert "the job ends: every rank of the world failed" in err
    assert "reset 1:" not in err and "1 reset in place" not in err, "no reset"
    assert "attempt 1" not in err, "no whole-job restart"
    assert "--elastic-timeout" not in err, "no wait for hosts"
    assert "start rank 2 fails at batch 2" in err
