"""The elastic policy on local ranks (docs/elastic.md, "The policy"): the round is decided once every rank
reported, whatever the spacing of the events. Every rank failing, seconds apart, ends the job at that
decision: no whole-job restart though --max-restarts allows one, no wait on --elastic-timeout."""

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
    if spacing == "0":
        assert done.returncode == 1, err
        assert "no reset in place: every rank of the world failed (3 ranks)" in err
        assert "the job ends: every rank of the world failed" in err
    else:
        # Spaced apart, the survivors may reach their commit before they fail (a fast machine): the first
        # round is then a reset, and a later one ends the job, by every rank failing or by too few left.
        assert done.returncode in (1, 3), err
        assert "every rank of the world failed" in err or "fewer than --min-np 2" in err, err
    assert "attempt 1" not in err, "no whole-job restart"
    assert "--elastic-timeout" not in err, "no wait for hosts"
    assert "start rank 2 fails at batch 2" in err
