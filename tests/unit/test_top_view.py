"""`distrun top`'s table and the console's host lines from the live view's rows (pure)."""

from __future__ import annotations

from launcher.diagnose.top_view import heading, host_summary, table


def _row(rank: int, host: str, **values: object) -> dict[str, object]:
    row: dict[str, object] = {
        "rank": rank, "host": host, "state": "running", "steps_per_s": None, "lines_per_s": None,
        "cpu_percent": None, "rss_bytes": None, "gpu_util_percent": None, "gpu_memory_bytes": None,
        "last_output_age_s": None, "straggler": False,
    }  # fmt: skip
    row.update(values)
    return row


ROWS = [
    _row(0, "h1", steps_per_s=4.0, cpu_percent=99.0, rss_bytes=2 << 30, gpu_util_percent=90.0,
         gpu_memory_bytes=10 << 30, last_output_age_s=0.4),
    _row(1, "h1", steps_per_s=2.0, cpu_percent=50.0, rss_bytes=1 << 30, gpu_util_percent=30.0,
         gpu_memory_bytes=12 << 30, straggler=True),
    _row(2, "h2", state="stopped", lines_per_s=1.5, cpu_percent=0.0, rss_bytes=400 << 20),
    _row(3, "h2", state="silent", last_output_age_s=45.0),
]  # fmt: skip


def test_the_table_has_every_rank_grouped_by_host_with_totals() -> None:
    lines = table(ROWS)
    assert lines[0].split() == [
        "RANK",
        "HOST",
        "STATE",
        "STEP",
        "RATE",
        "CPU%",
        "RSS",
        "GPU%",
        "GPU",
        "MEM",
        "LAST",
        "OUT",
        "COLL",
        "#",
    ]
    assert lines[1].split() == [
        "0",
        "h1",
        "running",
        "4",
        "it/s",
        "99",
        "2.0",
        "GiB",
        "90",
        "10.0",
        "GiB",
        "0.4s",
        "-",
    ]
    assert lines[2].split()[:3] == ["1", "running", "2"] and lines[2].endswith("straggler")
    assert lines[3].split()[:7] == ["h1", "total", "2", "ranks", "6", "it/s", "149"]
    assert "22.0 GiB" in lines[3] and " 60 " in lines[3]  # GPU memory summed, utilisation averaged
    assert lines[4].split()[:5] == ["2", "h2", "stopped", "1.5", "l/s"] and lines[4].endswith("stopped")
    assert lines[5].split()[:2] == ["3", "silent"] and lines[5].endswith("silent")
    assert lines[6].split()[:2] == ["h2", "total"]
    assert not any("\x1b" in line for line in lines)


def test_colours_mark_stragglers_and_quiet_ranks_only_when_asked() -> None:
    lines = table(ROWS, color=True)
    assert lines[2].startswith("\x1b[31m") and lines[4].startswith("\x1b[33m")
    assert not lines[1].startswith("\x1b")


def test_a_host_line_names_the_lowest_and_median_gpu_the_most_memory_and_the_slowest() -> None:
    assert host_summary("h1", ROWS[:2]) == (
        "h1:  GPU min 30% median 60%  GPU mem max 12.0 GiB (rank 1)  slowest rank 1 (2 it/s)"
    )
    # Without GPUs: CPU and resident memory instead.
    assert host_summary("h2", ROWS[2:]) == "h2:  CPU min 0% median 0%  RSS max 400 MiB (rank 2)"
    assert host_summary("h3", [_row(4, "h3", state="starting")]) == "h3: no samples yet"


def test_the_heading_says_what_the_job_does() -> None:
    document = {"pid": 42, "doing": "restarting in 3s", "attempt": 1, "interval": 2.0, "ranks": ROWS}
    assert (
        heading(document)
        == "distrun job 42: restarting in 3s; attempt 1; 4 ranks on 2 hosts; sampled every 2s"
    )
    assert (
        heading({"pid": 42, "doing": "starting its ranks", "ranks": []})
        == "distrun job 42: starting its ranks"
    )


def test_the_collective_column_shows_the_last_done_and_what_is_pending_and_marks_a_rank_behind() -> None:
    from launcher.diagnose.live import mark_behind

    rows = mark_behind(
        [
            {"rank": r, "host": "h1", "state": "running", "collective_issued": 43, "collective_done": 42}
            for r in range(3)
        ]
        + [{"rank": 3, "host": "h1", "state": "running", "collective_issued": 42, "collective_done": 42}]
        + [{"rank": 4, "host": "h1", "state": "running", "collective_issued": None, "collective_done": None}]
    )
    assert [r["collectives_behind"] for r in rows] == [None, None, None, 1, None]
    # Sampled while rank 0's collectives moved: a job on its way, nobody behind.
    moving = mark_behind([{**row, "collective_moving": row["rank"] == 0} for row in rows])
    assert [r["collectives_behind"] for r in moving] == [None] * 5
    lines = table(rows)
    assert lines[1].split()[-2:] == ["42", "+1"]
    assert lines[4].split()[-3:] == ["42", "1", "behind"]
    assert lines[5].split()[-1] == "-"


def test_ranks_that_left_at_a_reset_count_in_neither_the_heading_nor_the_totals() -> None:
    rows = [
        _row(0, "h1", world_rank=0, left=False),
        _row(1, "h1", world_rank=1, left=False),
        _row(2, "h2", world_rank=None, left=True, state="left"),
        _row(3, "h2", world_rank=None, left=True, state="left (killed SIGKILL)"),
    ]
    document = {"pid": 7, "doing": "running its ranks", "attempt": 0, "interval": 2.0, "ranks": rows}
    assert heading(document) == (
        "distrun job 7: running its ranks; attempt 0; 2 ranks on 1 host; 2 left at resets; sampled every 2s"
    )
    lines = table(rows)
    totals = {line.split()[0]: line.split()[2:4] for line in lines if " total " in line}
    assert totals == {"h1": ["2", "ranks"], "h2": ["0", "ranks"]}
    assert "left (killed SIGKILL)" in "\n".join(lines)
    assert table(rows, color=True)[3].startswith("\x1b[2m"), "a rank that left is dimmed"
