"""Restart decisions (pure) and the attempt loop around them, in-process with scripted attempts."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from launcher.core.blacklist import Blacklist, CooldownRange
from launcher.core.config import LaunchConfig, RestartOptions
from launcher.core.hosts import Host
from launcher.core.plan import Plan, build_plan, make_plan
from launcher.core.restart import GiveUp, HostBook, Restart, decide
from launcher.core.result import HostLost, Outcome, RankExit, RankFailed, Signalled, Succeeded, TimedOut
from launcher.job.discovery import DiscoveryError, parse_discovery_output
from launcher.job.run import Job, job_loop
from launcher.report.summary import summarize
from launcher.runtime.node import Node
from launcher.signals import signal_pipe
from tests.fakes import memory_relay

A, B, C = Host("a", slots=2), Host("b", slots=2), Host("c", slots=2)
FAILED_ON_B = RankFailed(RankExit(2, "b", 1))
LOST_B = HostLost("b", "no word from it for 10s")
ELASTIC = RestartOptions(max_restarts=3, min_np=2, max_np=6)


def _decide(outcome: Outcome, options: RestartOptions, done: int = 0, **kw: object) -> Restart | GiveUp:
    kw.setdefault("book", HostBook())
    return decide(
        outcome,
        restarts_done=done,
        options=options,
        hosts=(A, B),
        num_proc=4,
        now=0.0,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    "outcome", [Succeeded(), Signalled(signal.SIGINT), Signalled(signal.SIGTERM), TimedOut(5.0)]
)
def test_success_signals_and_timeout_never_restart(outcome: Outcome) -> None:
    assert _decide(outcome, RestartOptions(max_restarts=5)) == GiveUp()


@pytest.mark.parametrize("outcome", [FAILED_ON_B, LOST_B])
def test_a_failure_restarts_on_the_same_hosts_until_restarts_run_out(outcome: Outcome) -> None:
    options = RestartOptions(max_restarts=2)
    again = _decide(outcome, options, done=1)
    assert isinstance(again, Restart) and (again.hosts, again.num_proc) == ((A, B), 4)
    assert again.reason.startswith(("rank 2 (host b) exited with code 1", "lost host b"))
    assert _decide(outcome, options, done=2) == GiveUp("no restarts left (2 restarts used)")


def test_without_restarts_a_failure_simply_ends_the_job() -> None:
    assert _decide(FAILED_ON_B, RestartOptions()) == GiveUp()


def test_elastic_goes_on_without_a_lost_host() -> None:
    again = _decide(LOST_B, ELASTIC)
    assert isinstance(again, Restart) and (again.hosts, again.num_proc) == ((A,), 2)


def test_elastic_keeps_a_host_whose_agent_only_outwaited_a_stopped_distrun() -> None:
    """distrun's own silence (it was stopped) is no fault of the host: it is not left out, nor blamed."""
    ours = HostLost("b", "distrun itself did not run for 15s", ours=True)
    again = _decide(ours, ELASTIC)
    assert isinstance(again, Restart) and (again.hosts, again.num_proc) == ((A, B), 4)
    assert again.reason == "host b stopped its ranks (distrun itself did not run for 15s)"
    assert summarize(ours, lambda rank: []) == [
        "host b stopped its ranks: distrun itself did not run for 15s"
    ]


def test_elastic_below_min_np_gives_up_naming_what_is_left() -> None:
    options = RestartOptions(max_restarts=3, min_np=3, max_np=4)
    verdict = _decide(LOST_B, options)
    assert verdict == GiveUp("only 2 slots left without b (a), fewer than --min-np 3", below_min_np=True)


def test_elastic_leaves_out_a_host_that_fails_twice_in_a_row() -> None:
    book = HostBook()
    first = _decide(FAILED_ON_B, ELASTIC, book=book)
    assert isinstance(first, Restart) and first.hosts == (A, B)
    second = _decide(FAILED_ON_B, ELASTIC, done=1, book=book)
    assert isinstance(second, Restart) and second.hosts == (A,)


def test_discovered_hosts_join_up_to_max_np_and_excluded_ones_wait_out_their_cooldown() -> None:
    book = HostBook(Blacklist(CooldownRange(30.0, 300.0)))
    options = RestartOptions(max_restarts=3, min_np=2, max_np=5, cooldown_range=(30.0, 300.0))
    again = _decide(LOST_B, options, book=book, discovered=(B, C))
    assert isinstance(again, Restart) and again.hosts == (A, C) and again.num_proc == 4
    # The first cooldown: 30 x 2 (+ a jitter of up to 30 s, here none).
    assert book.blacklist.excluded["b"].until == 60.0
    later = decide(
        FAILED_ON_B, restarts_done=1, options=options, hosts=(A, C), num_proc=4, book=book, now=61.0,
        discovered=(B,),
    )  # fmt: skip
    assert isinstance(later, Restart) and later.hosts == (A, C, B) and later.num_proc == 5


def test_discovery_output_is_parsed_with_line_numbers(tmp_path: Path) -> None:
    script = tmp_path / "discover.sh"
    assert parse_discovery_output("a:2\n\n# spare\nb\na:4\n", script) == (
        Host("a", slots=4, origin=f"{script}:5"),
        Host("b", slots=1, origin=f"{script}:4"),
    ), "a host listed twice keeps its last line (Horovod's rule)"
    with pytest.raises(DiscoveryError, match=rf"{script} output line 2 'b:zero'"):
        parse_discovery_output("a\nb:zero\n", script)


class ScriptedJob(Job):
    """A Job whose attempts are scripted outcomes: the loop's decisions, without processes."""

    def __init__(self, config: LaunchConfig, wake_fd: int, outcomes: list[Outcome]) -> None:
        relay, _, self.err = memory_relay({})  # the relay writes to file descriptors
        super().__init__(config, relay, job_loop(config, wake_fd), [])
        self.outcomes = outcomes
        self.plans: list[Plan] = []

    def nodes_for(self, plan: Plan) -> list[Node]:
        return []

    def run_attempt(self, attempt: int, plan: Plan, nodes: object) -> Outcome:
        self.plans.append(plan)
        return self.outcomes.pop(0)


def _job(outcomes: list[Outcome], **restart: object) -> tuple[ScriptedJob, Outcome]:
    config = LaunchConfig(
        command=("train.py",),
        hosts=(A, B),
        num_proc=4,
        restart=RestartOptions(delay=0.0, **restart),  # type: ignore[arg-type]
    )
    with signal_pipe() as wake_fd:
        job = ScriptedJob(config, wake_fd, outcomes)
        return job, job.run(make_plan(config.hosts, config.num_proc, config.oversubscribe))


def test_the_loop_runs_attempts_until_one_succeeds_and_lists_them() -> None:
    job, outcome = _job([FAILED_ON_B, LOST_B, Succeeded()], max_restarts=3)
    assert outcome == Succeeded() and len(job.plans) == 3
    lines = job.closing_lines()
    assert lines[0] == "3 attempts:"
    assert "attempt 1: 4 ranks on a, b: lost host b" in lines[2]
    assert b"restarting in 0s (restart 2 of 3)" in job.err.getvalue()


def test_the_loop_stops_at_a_signal_even_with_restarts_left() -> None:
    job, outcome = _job([FAILED_ON_B, Signalled(signal.SIGINT)], max_restarts=5)
    assert outcome.exit_code == 130 and len(job.plans) == 2


def test_the_elastic_loop_shrinks_the_world_and_keeps_ranks_dense() -> None:
    job, outcome = _job([LOST_B, Succeeded()], max_restarts=3, min_np=2, max_np=4)
    assert outcome == Succeeded()
    assert [p.world_size for p in job.plans] == [4, 2]
    assert [s.rank for s in job.plans[1].slots] == [0, 1] and job.plans[1].nodes == (A,)


def test_the_elastic_loop_below_min_np_gives_up_with_the_reason() -> None:
    job, outcome = _job([LOST_B], max_restarts=3, min_np=3, max_np=4)
    assert outcome == LOST_B
    assert job.give_up is not None and job.give_up.below_min_np


def test_a_restart_plans_from_the_same_inputs_as_the_launch_oversubscription_included() -> None:
    config = LaunchConfig(
        command=("train.py",),
        hosts=(Host("localhost", slots=2),),
        num_proc=3,
        oversubscribe=True,
        restart=RestartOptions(max_restarts=1, delay=0.0),
    )
    failed = RankFailed(RankExit(2, "localhost", 1))
    with signal_pipe() as wake_fd:
        job = ScriptedJob(config, wake_fd, [failed, Succeeded()])
        outcome = job.run(build_plan(config.plan_inputs))
    assert outcome == Succeeded()
    assert [p.world_size for p in job.plans] == [3, 3]
    assert job.plans[1] == job.plans[0]


def test_an_elastic_job_below_min_np_waits_for_a_cooldown_to_end_then_restarts() -> None:
    lost = HostLost("b", "no word from it for 10s")
    job, outcome = _job([lost, Succeeded()], max_restarts=3, min_np=4, max_np=4, cooldown_range=(1.0, 1.0))
    assert outcome == Succeeded()
    assert [p.nodes for p in job.plans] == [(Host("a", slots=2), Host("b", slots=2))] * 2
    said = job.err.getvalue().decode()
    assert "leaving out host b for 1s (cooldown): lost (no word from it for 10s)" in said
    assert "only 2 slots left without b (a), fewer than --min-np 4: waiting up to 600s" in said


def test_the_wait_for_slots_ends_at_the_elastic_timeout(tmp_path: Path) -> None:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho a:2\n")
    script.chmod(0o755)
    lost = HostLost("b", "no word from it for 10s")
    job, outcome = _job(
        [lost], max_restarts=3, min_np=4, max_np=4, elastic_timeout=1.5, discovery_script=script
    )
    assert outcome == lost and len(job.plans) == 1
    assert job.give_up is not None and job.give_up.below_min_np
    assert job.give_up.message == (
        "only 2 slots left without b (a), fewer than --min-np 4; not enough came back within "
        "--elastic-timeout 1.5s"
    )


def test_below_min_np_the_discovery_script_is_polled_until_it_lists_enough_hosts(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    script = tmp_path / "discover.sh"
    # c appears from the script's third run on: the first is the restart's own, the next ones the wait's.
    script.write_text(
        f'#!/bin/sh\necho x >> {calls}\necho a:2\n[ "$(wc -l < {calls})" -ge 3 ] && echo c:2\nexit 0\n'
    )
    script.chmod(0o755)
    options = {"min_np": 4, "max_np": 4, "discovery_script": script, "elastic_timeout": 60.0}
    job, outcome = _job([LOST_B, Succeeded()], max_restarts=3, **options)
    assert outcome == Succeeded()
    assert [[h.name for h in p.nodes] for p in job.plans] == [["a", "b"], ["a", "c"]]
    assert len(calls.read_text().splitlines()) == 3
    said = job.err.getvalue().decode()
    below = "only 2 slots left without b (a), fewer than --min-np 4"
    assert f"{below}: waiting up to 60s (--elastic-timeout)" in said
    assert "attempt 1 takes in c" in said
