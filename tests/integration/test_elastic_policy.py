"""The elastic policy on local ranks (docs/elastic.md, "The policy"): the round is decided once every rank
reported. Every rank failing ends the job at that decision: no whole-job restart though --max-restarts allows
one, no wait on --elastic-timeout."""

from __future__ import annotations

from pathlib import Path

from tests.support import SCRIPTS, clean_env, run_distrun

SCRIPT = SCRIPTS / "elastic_train.py"


# Failures spaced seconds apart are not tested here yet: on a fast machine the survivors reach their commit
# before they fail, the first round resets, and what follows (a whole-job restart or the end) depends on the
# timing; the simulation in tests/unit/test_elastic_simulation.py covers the spacing of the events.
def test_every_rank_failing_together_ends_the_job_within_one_decision(tmp_path: Path) -> None:
    done = run_distrun(
        "-H", "localhost:3", "-np", "3", "--min-np", "2", "--max-restarts", "2", SCRIPT, tmp_path, "-1", "99",
        "5", env=clean_env(ELASTIC_FAIL_ALL_AT="2", ELASTIC_FAIL_SPACING_S="0"), timeout=240,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "no reset in place: every rank of the world failed (3 ranks)" in err
    assert "the job ends: every rank of the world failed" in err
    assert "attempt 1" not in err, "no whole-job restart"
    assert "--elastic-timeout" not in err, "no wait for hosts"
    assert "start rank 2 fails at batch 2" in err
