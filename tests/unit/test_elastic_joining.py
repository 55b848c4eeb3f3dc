"""A newcomer's top-level broadcasts (collectives.elastic.joining): skipped, once said, only in a rank the
launcher started at a reset and only until it enters hvd.elastic.run; the launcher marks its newcomers with
the variable the library reads."""

from __future__ import annotations

import logging

import pytest

from collectives.elastic import joining
from launcher.core.forward import JOINED_VAR, JobEnv, joined_env


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(joining, "_entered", False)
    monkeypatch.setattr(joining, "_said", False)


def test_a_newcomer_skips_until_it_enters_hvd_elastic_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(joining.JOINED_VAR, "1")
    with caplog.at_level(logging.WARNING):
        assert joining.skips_top_level_broadcast("hvd.broadcast_parameters")
        assert joining.skips_top_level_broadcast("hvd.broadcast_optimizer_state")
    assert len(caplog.records) == 1, "said once"
    assert "hvd.broadcast_parameters before hvd.elastic.run" in caplog.records[0].getMessage()
    joining.entered()
    assert not joining.skips_top_level_broadcast("hvd.broadcast_parameters"), "the state sync's own"


def test_a_rank_of_the_plan_never_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(joining.JOINED_VAR, raising=False)
    assert not joining.skips_top_level_broadcast("hvd.broadcast_parameters")


def test_the_launcher_marks_newcomers_with_the_variable_the_library_reads() -> None:
    env = JobEnv({"A": "1"}, ())
    assert JOINED_VAR == joining.JOINED_VAR
    assert joined_env(env).travelling == {"A": "1", JOINED_VAR: "1"}
    assert env.travelling == {"A": "1"}, "the job's own environment is unchanged"
