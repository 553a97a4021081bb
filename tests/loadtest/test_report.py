"""What a load test shows: the table marks the knee, notes say why steps broke, the plot is a PNG."""

from __future__ import annotations

import pytest
from rich.console import Console

from frontier.loadtest.report import knee_line, length_table, plot, step_notes, steps_table
from frontier.loadtest.stats import Distribution, LengthBucket, SloTargets, find_knee
from tests.loadtest.test_knee import step

SLO = SloTargets(ttft_ms=1000, tpot_ms=200, p99_latency_ms=2000, error_rate=0.01)
STEPS = [step(1), step(2), step(4, p99_ms=2500, failed=3)]


def rendered(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_the_table_marks_the_knee_and_the_broken_step():
    text = rendered(steps_table(STEPS, SLO, find_knee(STEPS, SLO)))
    rows = [line for line in text.splitlines() if line.strip().startswith("│")]
    assert "ok, knee" in rows[1] and "broken" in rows[2] and rows[0].rstrip("│ ").endswith("ok")


def test_the_table_gives_ttft_and_e2el_at_p95_beside_p50_and_p99():
    text = rendered(steps_table(STEPS[:1], SLO))
    assert "TTFT p50/p95/p99 ms" in text and "E2EL p50/p90/p95/p99 ms" in text
    assert "│         400/640/720/800 │" in text  # the first step's E2EL p50/p90/p95/p99


def test_the_input_length_table_gives_each_ranges_latency():
    def dist(ms: float) -> Distribution:
        return Distribution(count=10, mean_ms=ms, p50_ms=ms, p90_ms=ms, p95_ms=ms * 1.5, p99_ms=ms * 2)

    buckets = [
        LengthBucket(1, 128, 10, dist(100), dist(400)),
        LengthBucket(1025, 2048, 4, dist(900), dist(3000)),
    ]
    rows = [line for line in rendered(length_table(buckets)).splitlines() if line.startswith("│")]
    assert rows == [
        "│ 1-128         │       10 │         100/150/200 │         400/600/800 │",
        "│ 1025-2048     │        4 │     900/1,350/1,800 │   3,000/4,500/6,000 │",
    ]


def test_notes_give_errors_by_kind_and_every_broken_rule():
    (note,) = step_notes(STEPS, SLO)
    assert note.startswith("4 req/s: errors http_429 x3; error rate 3.0% > 1.0%; p99 E2EL 2500 ms > 2000 ms")


def test_the_knee_line_names_the_rate_and_why_the_next_step_broke():
    assert knee_line(find_knee(STEPS, SLO), STEPS).startswith("knee: 2 req/s per endpoint")
    assert "sweep lower rates" in knee_line(None, [step(3, p99_ms=9000)])


@pytest.mark.slow
def test_the_plot_is_a_png_of_latency_against_offered_load(tmp_path):
    out = plot(STEPS, SLO, find_knee(STEPS, SLO), tmp_path / "sub" / "plot.png", "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
