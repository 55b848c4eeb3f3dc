"""The blacklist and the spares (pure): who is left out, for how long, and which hosts a restart takes."""

from __future__ import annotations

import re

import pytest

from launcher.cli.main import _parse
from launcher.cli.request import Request
from launcher.core.blacklist import Blacklist, CooldownRange
from launcher.core.config import RestartOptions
from launcher.core.hosts import Host
from launcher.core.plan import make_plan
from launcher.core.restart import GiveUp, HostBook, Restart, decide, plan_restart
from launcher.core.result import HostLost, Outcome, RankExit, RankFailed
from launcher.errors import UsageError

H1, H2, H3, H4 = (Host(f"h{i}", slots=1) for i in range(1, 5))
USED, SPARES = (H1, H2, H3), (H4,)
LOST_H2 = HostLost("h2", "no word from it for 2.5s")


def _failed_on(host: str) -> RankFailed:
    return RankFailed(RankExit(1, host, 1))


@pytest.mark.parametrize(
    ("count", "jitter", "seconds"),
    [
        (1, 0.0, 20.0),  # Horovod: MIN * 2**count + jitter * MIN
        (1, 0.5, 25.0),
        (2, 0.0, 40.0),
        (3, 0.99, 80.0 + 9.9),
        (5, 0.0, 300.0),  # held at MAX
    ],
)
def test_the_cooldown_doubles_with_each_exclusion_within_the_range(
    count: int, jitter: float, seconds: float
) -> None:
    assert CooldownRange(10.0, 300.0).seconds(count, jitter) == pytest.approx(seconds)


def test_the_cooldown_is_never_below_min() -> None:
    assert CooldownRange(100.0, 100.0).seconds(1, 0.0) == 100.0


def test_without_a_cooldown_range_a_host_stays_out_for_the_rest_of_the_job() -> None:
    book = Blacklist()
    exclusion = book.add("h2", "lost (no word)", now=0.0)
    assert exclusion.until is None and not book.usable("h2", 1e9)
    assert exclusion.line(0.0) == "leaving out host h2 for the rest of the job: lost (no word)"
    assert book.back_at(["h2"], 0.0) is None


def test_with_a_range_a_host_comes_back_and_a_second_exclusion_lasts_longer() -> None:
    book = Blacklist(CooldownRange(5.0, 60.0))
    first = book.add("h2", "lost", now=0.0)
    assert (first.until, first.count) == (10.0, 1)
    assert first.line(0.0) == "leaving out host h2 for 10s (cooldown): lost"
    assert not book.usable("h2", 9.9) and book.usable("h2", 10.0)
    assert book.back_at(["h1", "h2"], 3.0) == 10.0
    # Left out again while the cooldown runs: the same cooldown, not a longer one (as Horovod).
    assert book.add("h2", "lost again", now=5.0) is first
    second = book.add("h2", "lost again", now=11.0)
    assert (second.until, second.count) == (31.0, 2)
    assert second.line(11.0).endswith("lost again, left out 2 times")


def _decide(outcome: Outcome, options: RestartOptions, book: HostBook | None = None) -> Restart | GiveUp:
    return decide(
        outcome, restarts_done=0, options=options, hosts=USED, num_proc=3, book=book or HostBook(), now=0.0,
        spares=SPARES,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "hosts", "num_proc"),
    [
        # --max-restarts 2: the spare h4 takes the lost h2's place (not h2 again).
        (RestartOptions(max_restarts=2), ("h1", "h3", "h4"), 3),
        # --min-np 3: three slots are left with the spare, so the job goes on at full size.
        (RestartOptions(max_restarts=3, min_np=3, max_np=3), ("h1", "h3", "h4"), 3),
        # --min-np 2 --max-np 4: every usable host, up to --max-np.
        (RestartOptions(max_restarts=3, min_np=2, max_np=4), ("h1", "h3", "h4"), 3),
    ],
)
def test_a_lost_host_is_replaced_by_a_spare(
    options: RestartOptions, hosts: tuple[str, ...], num_proc: int
) -> None:
    again = _decide(LOST_H2, options)
    assert isinstance(again, Restart)
    plan = make_plan(again.hosts, again.num_proc)
    assert tuple(h.name for h in plan.nodes) == hosts and plan.world_size == num_proc


def test_a_fixed_size_job_without_a_free_spare_restarts_on_the_same_hosts_and_says_so() -> None:
    book = HostBook()
    book.blacklist.add("h4", "unreachable", 0.0)
    again = _decide(LOST_H2, RestartOptions(max_restarts=2), book)
    assert isinstance(again, Restart) and again.hosts == USED and again.num_proc == 3
    assert again.note == "no spare host free for h2: restarting on the same hosts"


def test_a_restart_that_leaves_nobody_out_keeps_its_hosts_and_its_spares_idle() -> None:
    again = _decide(_failed_on("h2"), RestartOptions(max_restarts=2))
    assert isinstance(again, Restart) and again.note is None
    assert make_plan(again.hosts, again.num_proc).nodes == USED


def test_a_host_whose_ranks_failed_twice_in_a_row_is_replaced_by_a_spare() -> None:
    book = HostBook()
    options = RestartOptions(max_restarts=3)
    assert make_plan(*_hosts_np(_decide(_failed_on("h2"), options, book))).nodes == USED
    second = _decide(_failed_on("h2"), options, book)
    assert make_plan(*_hosts_np(second)).nodes == (H1, H3, H4)
    assert book.blacklist.excluded["h2"].reason == (
        "its ranks failed 2 times in a row (last: rank 1 exited with code 1)"
    )


def _hosts_np(decision: Restart | GiveUp) -> tuple[tuple[Host, ...], int]:
    assert isinstance(decision, Restart)
    return decision.hosts, decision.num_proc


def test_below_min_np_says_when_a_host_comes_back() -> None:
    book = HostBook(Blacklist(CooldownRange(5.0, 60.0)))
    options = RestartOptions(max_restarts=3, min_np=3, max_np=3, cooldown_range=(5.0, 60.0))
    verdict = decide(
        LOST_H2, restarts_done=0, options=options, hosts=USED, num_proc=3, book=book, now=0.0, spares=()
    )
    assert verdict == GiveUp(
        "only 2 slots left without h2 (h1, h3), fewer than --min-np 3", below_min_np=True, back_at=10.0
    )
    # Once its cooldown is over, the same question has another answer.
    later = plan_restart("lost host h2", None, options=options, hosts=USED, num_proc=3, book=book, now=10.0)
    assert isinstance(later, Restart) and later.hosts == USED


def _config(*argv: str) -> RestartOptions:
    request = _parse([*argv, "-H", "a:1,b:1,c:1", "-np", "2", "true"])
    assert isinstance(request, Request)
    return request.config.restart


def test_the_elastic_options_parse_with_horovods_defaults() -> None:
    plain = _config("--min-np", "1")
    assert plain.elastic_timeout == 600.0 and plain.cooldown_range is None
    given = _config("--min-np", "1", "--elastic-timeout", "30", "--blacklist-cooldown-range", "5", "60")
    assert given.elastic_timeout == 30.0 and given.cooldown_range == (5.0, 60.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--elastic-timeout", "30"), "--elastic-timeout makes the job elastic and needs --min-np"),
        (
            ("--blacklist-cooldown-range", "5", "60"),
            "--blacklist-cooldown-range makes the job elastic and needs --min-np",
        ),
        (("--min-np", "1", "--elastic-timeout", "0"), "--elastic-timeout must be a positive number"),
        (
            ("--min-np", "1", "--blacklist-cooldown-range", "60", "5"),
            "--blacklist-cooldown-range 60 5: expected 1 <= MIN <= MAX <= 3600 seconds",
        ),
        (
            ("--min-np", "1", "--blacklist-cooldown-range", "0", "5"),
            "--blacklist-cooldown-range 0 5: expected 1 <= MIN <= MAX <= 3600 seconds",
        ),
    ],
)
def test_bad_elastic_options_are_one_line_naming_the_option(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        _config(*argv)


def test_a_failure_absorbed_by_a_reset_in_place_counts_as_one_that_ended_an_attempt() -> None:
    book = HostBook()
    assert book.rank_failed("h2", "rank 1 (host h2) was killed by SIGKILL (exit code 137)", 0.0) is None
    again = _decide(_failed_on("h2"), RestartOptions(max_restarts=3), book)
    assert make_plan(*_hosts_np(again)).nodes == (H1, H3, H4)
    assert not book.blacklist.usable("h2", 0.0)
    # A failure on another host in between breaks the row.
    other = HostBook()
    other.rank_failed("h2", "rank 1 exited with code 1", 0.0)
    other.rank_failed("h3", "rank 2 exited with code 1", 0.0)
    assert other.rank_failed("h2", "rank 1 exited with code 1", 0.0) is None
