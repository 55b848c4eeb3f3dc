"""The outlier rule, the pairing and the judging of `check --perf`, table-tested with recorded figures (pure).

The figures are of the shapes the simulated cluster produced on a shared 2-core machine: healthy links
between 0.5 and 3.5 GB/s, a link shaped to 20 Mbit/s at 2.4 MB/s, CPU compute between 0.3 and 4.4 GFLOP/s.
"""

from __future__ import annotations

import itertools

import pytest

from launcher.check.figures import Gpu, HostFigures, LinkSample, judge, link_figures, suspects
from launcher.check.outliers import RULES, outliers
from launcher.check.pairing import matchings, retests

LINK = RULES["link"]
COMPUTE = RULES["compute"]
LATENCY = RULES["latency"]


@pytest.mark.parametrize(
    ("figures", "rule", "expected"),
    [
        # healthy spreads, as recorded run after run: nobody
        ({"h1": 2.3e9, "h2": 1.6e9, "h3": 456e6}, LINK, []),
        ({"h1": 810e6, "h2": 1.1e9, "h3": 2.5e9, "h4": 497e6}, LINK, []),
        ({"h1": 3.1e9, "h2": 2.4e9, "h3": 762e6, "h4": 504e6}, LINK, []),
        ({"h1": 7.9, "h2": 9.8, "h3": 8.5, "h4": 8.9}, COMPUTE, []),
        ({"h1": 1.6, "h2": 4.4, "h3": 2.1, "h4": 3.0, "h5": 1.2}, COMPUTE, []),
        ({"h1": 40e-6, "h2": 50e-6, "h3": 41e-6, "h4": 38e-6}, LATENCY, []),
        ({"h1": 40e-6, "h2": 400e-6, "h3": 41e-6}, LATENCY, []),  # 10x, but under a millisecond more
        # one slow host
        ({"h1": 1.1e9, "h2": 819e6, "h3": 2.4e6, "h4": 497e6}, LINK, ["h3"]),
        ({"h1": 1.6, "h2": 0.1, "h3": 4.4, "h4": 2.1}, COMPUTE, ["h2"]),
        ({"h1": 20.0, "h2": 21.0, "h3": 9.0, "h4": 19.0}, COMPUTE, ["h3"]),
        # a much faster one (re-tested on idle cores) does not hide a throttled one
        ({"h1": 26.4, "h2": 0.4, "h3": 23.7, "h4": 174.6}, COMPUTE, ["h2"]),
        ({"h1": 40e-6, "h2": 50e-6, "h3": 5e-3, "h4": 45e-6}, LATENCY, ["h3"]),
        # two slow hosts among six
        ({"h1": 1e9, "h2": 1.2e9, "h3": 3e6, "h4": 0.9e9, "h5": 2.5e6, "h6": 1.1e9}, LINK, ["h3", "h5"]),
        # all equal, and too few peers for a median
        ({"h1": 5.0, "h2": 5.0, "h3": 5.0, "h4": 5.0}, COMPUTE, []),
        ({"h1": 1e9, "h2": 1e6}, LINK, []),
        ({}, LINK, []),
    ],
)
def test_rule(figures: dict[str, float], rule: object, expected: list[str]) -> None:
    assert outliers(figures, rule) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [2, 3, 4, 5, 7, 8, 16, 32, 33])
def test_matchings_are_perfect_and_never_repeat_a_pair(count: int) -> None:
    hosts = [f"h{i}" for i in range(count)]
    rounds = matchings(hosts)
    assert len(rounds) == min(3, count - 1 if count % 2 == 0 else count)
    seen: set[frozenset[str]] = set()
    for pairs in rounds:
        members = [h for pair in pairs for h in pair]
        assert len(members) == len(set(members)), "one transfer per host per round"
        assert len(members) >= count - 1, "everyone but one odd host out is paired"
        for pair in pairs:
            assert frozenset(pair) not in seen
            seen.add(frozenset(pair))
    partners = {h: sum(h in pair for pairs in rounds for pair in pairs) for h in hosts}
    assert min(partners.values()) >= min(2, count - 1), partners


def test_retests_pair_each_suspect_with_a_good_host_once_per_round() -> None:
    assert retests(["h3"], ["h1", "h2"]) == ((("h1", "h3"),),)
    assert retests(["h3", "h5", "h7"], ["h1", "h2"]) == ((("h1", "h3"), ("h2", "h5")), (("h1", "h7"),))
    assert retests(["h3"], []) == ()


def _samples(rates: dict[frozenset[str], float], hosts: list[str]) -> list[LinkSample]:
    samples = []
    for pairs in matchings(hosts):
        for a, b in pairs:
            rate = rates.get(frozenset((a, b)), 1e9)
            samples.append(LinkSample(a, b, rate, rate * 0.95, 40e-6))
    return samples


def _slow_host(host: str, hosts: list[str]) -> dict[frozenset[str], float]:
    return {frozenset((host, other)): 2.4e6 for other in hosts if other != host}


def test_one_slow_host_alone_is_named_with_its_partners() -> None:
    hosts = ["h1", "h2", "h3", "h4"]
    samples = _samples(_slow_host("h3", hosts), hosts)
    assert suspects(samples) == ["h3"]
    samples += [LinkSample("h1", "h3", 2.5e6, 2.4e6, 40e-6, retest=True)]
    [found] = judge([HostFigures(h) for h in hosts], samples)
    assert (found.host, found.kind, found.unit) == ("h3", "link", "B/s")
    assert found.line() == (
        "h3: link 2.5 MB/s in, 2.4 MB/s out; median 975.0 MB/s (slow with h2, h4 and h1): "
        "check its NIC and cable (ethtool: speed, errors)"
    )


def test_two_slow_hosts_do_not_make_a_good_partner_look_bad() -> None:
    hosts = [f"h{i}" for i in range(1, 9)]
    rates = {**_slow_host("h2", hosts), **_slow_host("h5", hosts)}
    samples = _samples(rates, hosts)
    # A good host met both slow ones; its third partner was good: its best is good.
    found = judge([HostFigures(h) for h in hosts], samples)
    assert sorted({o.host for o in found}) == ["h2", "h5"]


def test_a_slow_pair_names_neither_host() -> None:
    """One bad link between two good hosts (a cable between them, not either host): each is fast with its
    other partners, so neither host is named."""
    hosts = ["h1", "h2", "h3", "h4", "h5", "h6"]
    first = matchings(hosts)[0][0]
    samples = _samples({frozenset(first): 2.4e6}, hosts)
    assert suspects(samples) == []
    assert judge([HostFigures(h) for h in hosts], samples) == []


def test_a_suspect_cleared_by_its_retest_is_not_named() -> None:
    hosts = ["h1", "h2", "h3", "h4"]
    samples = _samples(_slow_host("h3", hosts), hosts)
    samples.append(LinkSample("h1", "h3", 1.1e9, 1.0e9, 40e-6, retest=True))  # a passing moment
    assert judge([HostFigures(h) for h in hosts], samples) == []
    assert link_figures(samples).inbound["h3"] == 1.1e9


def test_compute_gpu_and_intra_host_outliers() -> None:
    def gpus(host: str, slow: int | None = None) -> tuple[Gpu, ...]:
        return tuple(Gpu(i, "H100", "bf16", 120.0 if i == slow else 700.0 + i) for i in range(8))

    hosts = [
        HostFigures("g1", backend="nccl", gpus=gpus("g1"), intra_host_bps=350e9),
        HostFigures("g2", backend="nccl", gpus=gpus("g2", slow=3), intra_host_bps=360e9),
        HostFigures("g3", backend="nccl", gpus=gpus("g3"), intra_host_bps=20e9),
    ]
    found = judge(hosts, [])
    assert [(o.host, o.kind) for o in found] == [("g2", "gpu"), ("g3", "intra-host")]
    assert found[0].text.startswith("GPU 3 (H100) 120.0 TFLOP/s bf16; median 703.")
    assert [o.record()["unit"] for o in found] == ["TFLOP/s", "B/s"]


def test_healthy_recorded_runs_name_nobody() -> None:
    """Every healthy run the simulated cluster recorded, judged together in every order."""
    runs = [
        ({"h1": 19.8, "h2": 20.7, "h3": 27.5}, {"h1": 2.3e9, "h2": 1.6e9, "h3": 456e6}),
        ({"h1": 7.9, "h2": 9.8, "h3": 8.5, "h4": 8.9}, {"h1": 810e6, "h2": 1.1e9, "h3": 819e6, "h4": 497e6}),
    ]
    for compute, link in runs:
        for order in itertools.permutations(compute):
            assert outliers({h: compute[h] for h in order}, COMPUTE) == []
            assert outliers({h: link[h] for h in order}, LINK) == []


def test_report_perf_object_matches_the_schema() -> None:
    import json

    import jsonschema

    from launcher.check.perf import PerfResult
    from launcher.check.verdict import Finding
    from launcher.report.account import build_report
    from tests.support import REPO

    hosts = ["h1", "h2", "h3", "h4"]
    samples = _samples(_slow_host("h3", hosts), hosts)
    figures = [HostFigures(h, compute_gflops=8.0) for h in hosts]
    result = PerfResult(
        hosts=tuple(figures),
        samples=tuple(samples),
        outliers=tuple(judge(figures, samples)),
        problems=(Finding("h5", "cannot run the measurement: No module named 'torch'", "pip install torch"),),
        allreduce_bps=1.9e6,
        seconds=4.2,
        rounds=3,
    )
    assert result.named == ["h3", "h5"]
    report = build_report(
        run_id="r", command=["distrun", "check", "--perf"], exit_code=3, attempts=[], failure=None,
        perf=result.record(),
    )  # fmt: skip
    jsonschema.validate(report, json.loads((REPO / "docs" / "report.schema.json").read_text()))
    assert report["perf"]["outliers"] == [
        {"host": "h3", "kind": "link", "value": 2.4e6, "median": 975e6, "unit": "B/s"}
    ]


def test_compute_suspects_are_cleared_or_confirmed_against_good_hosts() -> None:
    from launcher.check.figures import compute_suspects, references, still_slow

    recorded = {"h1": 7.5, "h2": 15.0, "h3": 5.1, "h4": 7.1, "h5": 8.3, "h6": 10.3, "h7": 0.9, "h8": 0.2}
    first = [HostFigures(h, compute_gflops=v) for h, v in recorded.items()]
    assert compute_suspects(first) == ["h7", "h8"]
    assert references(first, ["h7", "h8"]) == ["h2", "h6"]
    # Measured again at the same time as h2 and h6 (the machine now quieter for all of them): h7, crowded a
    # moment before, keeps up with them; h8, under a CPU quota, does not.
    refs = [HostFigures("h2", compute_gflops=40.0), HostFigures("h6", compute_gflops=30.0)]
    assert not still_slow(HostFigures("h7", compute_gflops=25.0), refs)
    assert still_slow(HostFigures("h8", compute_gflops=0.4), refs)
    gpus = (Gpu(0, "H100", "bf16", 700.0), Gpu(1, "H100", "bf16", 690.0))
    good = [HostFigures("g1", gpus=gpus), HostFigures("g2", gpus=gpus)]
    assert still_slow(
        HostFigures("g3", gpus=(Gpu(0, "H100", "bf16", 700.0), Gpu(1, "H100", "bf16", 90.0))), good
    )
    assert not still_slow(HostFigures("g3", gpus=gpus), good)


def test_lines_name_the_outliers_last_and_colour_their_figures_on_a_terminal() -> None:
    from launcher.check.perf import PerfResult, perf_lines

    hosts = ["h1", "h2", "h3", "h4"]
    samples = _samples(_slow_host("h3", hosts), hosts)
    figures = [HostFigures(h, compute_gflops=8.0) for h in hosts]
    result = PerfResult(tuple(figures), tuple(samples), tuple(judge(figures, samples)), seconds=3.0)
    plain = perf_lines(result, color=False)
    assert plain[0].split() == ["host", "compute", "intra-host", "link", "in", "link", "out", "latency"]
    assert [line.split()[0] for line in plain[1:6]] == ["h1", "h2", "h3", "h4", "median"]
    assert plain[-2].startswith(
        "h3: link 2.4 MB/s in, 2.4 MB/s out; median 975.0 MB/s (slow with h2, h4 and h1)"
    )
    assert plain[-1] == "perf: 1 named (h3); 4 hosts measured in 3.0s"
    coloured = perf_lines(result, color=True)
    h3 = next(line for line in coloured if line.startswith("h3 "))
    assert h3.count("\x1b[31m") == 2, "link in and link out in red"
    assert "\x1b[31m" not in next(line for line in coloured if line.startswith("h1 "))
