"""What a load test shows: the table marks the knee, notes say why steps broke, the plot is a PNG."""

from __future__ import annotations

from dataclasses import fields

import pytest
from rich.console import Console

from frontier.loadtest.report import (
    ServedStep,
    cpu_text,
    gpu_text,
    knee_line,
    length_table,
    plot,
    step_notes,
    steps_table,
)
from frontier.loadtest.stats import Distribution, LengthBucket, SloTargets, StepSummary, find_knee
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


def test_the_table_gives_ttft_itl_and_e2el_at_p95_beside_p50_and_p99():
    text = rendered(steps_table(STEPS[:1], SLO))
    assert "TTFT ms p50/95/99" in text and "ITL ms p50/95/99" in text and "E2EL ms p50/90/95/99" in text
    assert "│      400/640/720/800 │" in text  # the first step's E2EL p50/p90/p95/p99


def served(**use: object) -> ServedStep:
    base = STEPS[0]
    return ServedStep(**{f.name: getattr(base, f.name) for f in fields(StepSummary)}, **use)


def test_a_cpu_host_shows_no_gpu_never_a_zero():
    assert gpu_text(served(cpu_cores=0.42, gpus=0)) == "no GPU"
    assert cpu_text(served(cpu_cores=0.42, gpus=0)) == "0.42"


def test_a_gpu_host_shows_its_utilisation_and_peak_memory():
    assert gpu_text(served(gpus=1, gpu_util_pct=73.4, gpu_memory_bytes=40 * 2**30)) == "73% 40.0 GiB"


def test_a_gpu_whose_runtime_exports_no_utilisation_says_so():
    assert gpu_text(served(gpus=2)) == "2 GPU, not exported"


def test_unread_metrics_show_a_dash_for_cpu_and_gpu():
    assert (cpu_text(served()), gpu_text(served())) == ("-", "-")


def test_the_input_length_table_gives_each_ranges_latency():
    def dist(ms: float) -> Distribution:
        return Distribution(count=10, mean_ms=ms, p50_ms=ms, p90_ms=ms, p95_ms=ms * 1.5, p99_ms=ms * 2)

    buckets = [
        LengthBucket(1, 256, 10, dist(100), dist(10), dist(400)),
        LengthBucket(4096, None, 4, dist(900), dist(20), dist(3000)),
    ]
    rows = [line for line in rendered(length_table(buckets)).splitlines() if line.startswith("│")]
    assert rows == [
        "│ <256          │       10 │       100/150/200 │         10/15/20 │       400/600/800 │",
        "│ >=4k          │        4 │   900/1,350/1,800 │         20/30/40 │ 3,000/4,500/6,000 │",
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
