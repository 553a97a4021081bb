"""Load-test statistics against hand-computed samples."""

from __future__ import annotations

import math

import pytest

from frontier.loadtest.stats import (
    Distribution,
    RequestSample,
    SloTargets,
    by_input_length,
    percentile,
    summarize,
)

SLO = SloTargets(ttft_ms=500, tpot_ms=100, p99_latency_ms=2000, error_rate=0.05)


def ok(sent_at: float, ttft: float, e2el: float, tokens: int, itl: tuple[float, ...] = (), prompt: int = 0):
    return RequestSample(
        sent_at, True, ttft_s=ttft, e2el_s=e2el, output_tokens=tokens, itl_s=itl, prompt_tokens=prompt
    )


def test_percentile_interpolates_linearly_between_ranks():
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert percentile(values, 50) == 30.0
    assert percentile(values, 90) == pytest.approx(46.0)  # rank 3.6: 40 + 0.6 * 10
    assert percentile(values, 99) == pytest.approx(49.6)
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 50.0


def test_percentile_of_nothing_is_nan_and_q_is_range_checked():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)


def test_tpot_is_decode_time_per_token_after_the_first():
    sample = ok(0.0, ttft=0.2, e2el=1.2, tokens=11)
    assert sample.tpot_s == pytest.approx(0.1)


def test_tpot_is_undefined_for_a_single_token_or_a_failure():
    assert ok(0.0, 0.2, 0.2, 1).tpot_s is None
    assert RequestSample(0.0, False, error="http_429").tpot_s is None


def test_a_request_meets_the_slo_only_when_every_target_holds():
    assert ok(0, ttft=0.4, e2el=1.0, tokens=11).meets(SLO)
    assert not ok(0, ttft=0.6, e2el=1.0, tokens=11).meets(SLO)  # TTFT 600 > 500
    assert not ok(0, ttft=0.1, e2el=2.1, tokens=101).meets(SLO)  # E2EL 2100 > 2000
    assert not ok(0, ttft=0.1, e2el=1.9, tokens=11).meets(SLO)  # TPOT 180 > 100
    assert not RequestSample(0, False, error="connect").meets(SLO)


def test_distribution_is_in_milliseconds():
    d = Distribution.of_seconds([0.1, 0.2, 0.3])
    assert d.count == 3
    assert d.mean_ms == pytest.approx(200)
    assert d.p50_ms == pytest.approx(200)


def test_the_distribution_has_the_p95_between_its_p90_and_p99():
    d = Distribution.of_seconds([i / 100 for i in range(1, 21)])  # 10 ms .. 200 ms
    assert d.p95_ms == pytest.approx(190.5)  # rank 18.05: 190 + 0.05 * 10
    assert d.p90_ms < d.p95_ms < d.p99_ms


def test_summary_counts_errors_by_kind_and_the_error_rate():
    samples = [
        ok(0.0, 0.1, 0.5, 5),
        RequestSample(1.0, False, error="http_429"),
        RequestSample(2.0, False, error="http_429"),
        RequestSample(3.0, False, error="connect"),
    ]
    s = summarize(samples, window=(0.0, 10.0), slo=SLO, offered_rps=0.4)
    assert (s.sent, s.completed, s.failed) == (4, 1, 3)
    assert s.errors == {"http_429": 2, "connect": 1}
    assert s.error_rate == pytest.approx(0.75)


def test_throughput_counts_completions_in_the_window_shifted_by_the_median_latency():
    step = [
        ok(10.0, 0.1, 1.0, 10, prompt=5),
        ok(11.0, 0.1, 1.0, 20, prompt=5),
        ok(13.0, 0.1, 1.0, 30, prompt=5),
    ]
    earlier = [ok(9.5, 0.1, 1.0, 40), ok(9.8, 0.1, 1.5, 50)]  # finish at 10.5 (before 11) and 11.3
    s = summarize(step, window=(10.0, 14.0), slo=SLO, offered_rps=0.75, completions=[*earlier, *step])
    assert s.lag_s == pytest.approx(1.0)
    assert s.sent_rps == pytest.approx(0.75)
    assert s.throughput_rps == pytest.approx(4 / 4)  # finished within [11, 15]: 11.3, 11, 12, 14
    assert s.output_tokens_per_s == pytest.approx((50 + 10 + 20 + 30) / 4)
    assert s.total_tokens_per_s == pytest.approx((110 + 15) / 4)


def test_a_server_falling_behind_completes_fewer_than_were_sent():
    # Each request waits longer than the one before: a queue grows.
    samples = [ok(10.0 + i, 0.1, 1.0 + i, 5) for i in range(4)]  # finish at 11, 13, 15, 17
    s = summarize(samples, window=(10.0, 14.0), slo=SLO, offered_rps=1.0)
    assert s.lag_s == pytest.approx(2.5)
    assert s.throughput_rps == pytest.approx(2 / 4)  # within [12.5, 16.5]: 13 and 15
    assert s.tracking == pytest.approx(0.5)


def test_attainment_is_the_share_of_completed_requests_meeting_every_slo():
    samples = [
        ok(0, 0.1, 0.5, 5),
        ok(0, 0.9, 1.0, 5),
        ok(0, 0.1, 0.4, 5),
        RequestSample(0, False, error="http_429"),
    ]
    s = summarize(samples, window=(0.0, 4.0), slo=SLO)
    assert s.met_slo == 2
    assert s.attainment == pytest.approx(2 / 3)


def test_goodput_counts_only_requests_meeting_the_slo_per_second():
    samples = [
        ok(0, 0.1, 0.5, 5),
        ok(1, 0.9, 1.0, 5),
        ok(2, 0.1, 0.4, 5),
        RequestSample(3, False, error="timeout"),
    ]
    s = summarize(samples, window=(0.0, 4.0), slo=SLO)
    assert s.goodput_rps == pytest.approx(2 / 4)


def test_itl_is_pooled_over_requests_and_tpot_taken_per_request():
    samples = [
        ok(0, 0.1, 0.3, 3, itl=(0.1, 0.1)),
        ok(0, 0.1, 0.7, 3, itl=(0.3, 0.3)),
    ]
    s = summarize(samples, window=(0.0, 1.0), slo=SLO)
    assert s.itl.count == 4
    assert s.itl.p50_ms == pytest.approx(200)  # pooled [100, 100, 300, 300]
    assert s.tpot.count == 2
    assert s.tpot.mean_ms == pytest.approx(200)  # (100 + 300) / 2


def test_latency_percentiles_ignore_failed_requests():
    samples = [ok(0, 0.1, 0.2, 2), ok(0, 0.1, 0.4, 2), RequestSample(0, False, error="http_503")]
    s = summarize(samples, window=(0.0, 1.0), slo=SLO)
    assert s.e2el.count == 2
    assert s.e2el.p50_ms == pytest.approx(300)


def test_completed_requests_are_split_by_prompt_length_at_the_edges():
    def sample(prompt: int, e2el: float, ok: bool = True) -> RequestSample:
        return RequestSample(
            sent_at=0,
            ok=ok,
            ttft_s=e2el / 4,
            e2el_s=e2el,
            itl_s=(e2el / 8, e2el / 8),
            prompt_tokens=prompt,
            output_tokens=3,
        )

    samples = [sample(20, 0.1), sample(255, 0.2), sample(256, 0.4), sample(5000, 1.0), sample(9000, 1.2)]
    samples.append(sample(0, 9.0, ok=False))  # failed: no prompt length counted
    buckets = by_input_length(samples, (256, 1024, 4096))
    assert [(b.label, b.requests) for b in buckets] == [("<256", 2), ("256-1k", 1), (">=4k", 2)]
    assert buckets[2].e2el.p50_ms == pytest.approx(1100)
    assert buckets[2].itl.p50_ms == pytest.approx(137.5)


def test_without_edges_every_completed_request_is_one_range():
    samples = [RequestSample(sent_at=0, ok=True, ttft_s=0.1, e2el_s=0.2, prompt_tokens=n) for n in (5, 5000)]
    (bucket,) = by_input_length(samples)
    assert (bucket.label, bucket.requests) == ("all", 2)


@pytest.mark.parametrize("edges", [(256, 256), (1024, 256), (1, 256)])
def test_edges_that_do_not_increase_from_2_are_refused(edges):
    with pytest.raises(ValueError, match="must be >= 2 tokens and increase strictly"):
        by_input_length([], edges)
