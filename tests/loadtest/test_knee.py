"""The knee of a step load, against hand-made steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frontier.loadtest.report import scaling_target
from frontier.loadtest.stats import Distribution, SloTargets, StepSummary, concurrency_knee, find_knee

SLO = SloTargets(ttft_ms=1000, tpot_ms=200, p99_latency_ms=2000, error_rate=0.01)


def step(
    rate: float,
    *,
    p99_ms: float = 800,
    failed: int = 0,
    tracking: float = 1.0,
    sent: int = 100,
    met: float = 1.0,
) -> StepSummary:
    e2el = Distribution(
        count=sent - failed,
        mean_ms=p99_ms / 2,
        p50_ms=p99_ms / 2,
        p90_ms=p99_ms * 0.8,
        p95_ms=p99_ms * 0.9,
        p99_ms=p99_ms,
    )
    sent_rps = sent / 10
    return StepSummary(
        offered_rps=rate,
        duration_s=10,
        sent=sent,
        completed=sent - failed,
        failed=failed,
        errors={"http_429": failed} if failed else {},
        sent_rps=sent_rps,
        throughput_rps=sent_rps * tracking,
        output_tokens_per_s=0,
        total_tokens_per_s=0,
        goodput_rps=(sent - failed) * met / 10,
        met_slo=round((sent - failed) * met),
        ttft=e2el,
        tpot=e2el,
        itl=e2el,
        e2el=e2el,
    )


def test_knee_is_the_last_rate_before_p99_breaks_the_slo():
    knee = find_knee([step(1), step(2), step(4, p99_ms=1900), step(8, p99_ms=2500)], SLO)
    assert knee is not None
    assert knee.rate_rps == 4
    assert knee.broke_at_rps == 8
    assert "p99 E2EL 2500 ms > 2000 ms" in knee.broke_because[0]


def test_an_error_rate_above_the_slo_breaks_a_step():
    knee = find_knee([step(1), step(2, failed=2), step(4)], SLO)
    assert knee is not None and knee.rate_rps == 1
    assert knee.broke_because == ["error rate 2.0% > 1.0%"]


def test_throughput_that_stops_tracking_offered_load_breaks_a_step():
    # Latency still under the SLO only because the step ended while a queue grew.
    knee = find_knee([step(1), step(2, tracking=0.95), step(4, tracking=0.6)], SLO)
    assert knee is not None and knee.rate_rps == 2
    assert "throughput" in knee.broke_because[0]


def test_a_step_where_too_few_requests_meet_every_slo_breaks():
    # p99 E2EL still fine, but a quarter of the requests waited past the TTFT target.
    knee = find_knee([step(1), step(2, met=0.95), step(4, met=0.75)], SLO)
    assert knee is not None and knee.rate_rps == 2
    assert knee.broke_because == ["only 75.0% of requests met every SLO (< 90%)"]


def test_a_step_that_holds_after_a_broken_one_is_not_capacity():
    knee = find_knee([step(1), step(2, p99_ms=3000), step(4)], SLO)
    assert knee is not None and knee.rate_rps == 1


def test_steps_are_judged_in_rate_order_whatever_order_they_come_in():
    knee = find_knee([step(8, p99_ms=2500), step(2), step(1), step(4)], SLO)
    assert knee is not None and knee.rate_rps == 4


def test_no_knee_when_the_lowest_step_already_breaks():
    assert find_knee([step(1, p99_ms=5000), step(2, p99_ms=6000)], SLO) is None


def test_when_every_step_holds_the_knee_is_the_highest_with_nothing_broken():
    knee = find_knee([step(1), step(2)], SLO)
    assert knee is not None and knee.rate_rps == 2
    assert knee.broke_at_rps is None


def test_a_step_with_no_requests_breaks():
    assert find_knee([step(1, sent=0)], SLO) is None


def closed_loop(clients: int, throughput: float, mean_ms: float) -> StepSummary:
    e2el = Distribution(
        count=100, mean_ms=mean_ms, p50_ms=mean_ms, p90_ms=mean_ms, p95_ms=mean_ms, p99_ms=mean_ms
    )
    return replace(step(1), offered_rps=None, concurrency=clients, throughput_rps=throughput, e2el=e2el)


def test_the_concurrency_knee_is_the_last_level_before_latency_outgrows_throughput():
    # 1 -> 2 -> 4: throughput doubles, latency barely moves; 4 -> 8: throughput x1.25, latency x1.6.
    sweep = [
        closed_loop(1, 4, 250),
        closed_loop(2, 8, 255),
        closed_loop(4, 15, 270),
        closed_loop(8, 18.75, 430),
    ]
    knee = concurrency_knee(sweep)
    assert knee is not None
    assert (knee.concurrency, knee.next_concurrency) == (4, 8)
    assert knee.throughput_ratio == pytest.approx(1.25) and knee.latency_ratio == pytest.approx(430 / 270)


def test_a_sweep_that_never_passes_the_knee_puts_it_at_the_top_level():
    knee = concurrency_knee([closed_loop(1, 4, 250), closed_loop(2, 8, 250)])
    assert knee is not None and (knee.concurrency, knee.next_concurrency) == (2, None)


def test_one_level_has_no_knee():
    assert concurrency_knee([closed_loop(4, 15, 270)]) is None


def test_the_knee_per_replica_is_the_groups_scale_in_utilisation():
    knee = concurrency_knee([closed_loop(6, 15, 270), closed_loop(12, 16, 500)])
    assert knee is not None
    target = scaling_target(knee, replicas=2, group="gpu", max_concurrency=16)
    assert (target.running_per_replica, target.utilisation, target.capped) == (3, 0.19, False)
    assert "      scale_in_utilisation: 0.19  # measured knee, 3/16" in target.lines(knee)


def test_a_knee_above_max_concurrency_is_capped_at_all_of_it():
    knee = concurrency_knee([closed_loop(32, 15, 270), closed_loop(64, 16, 900)])
    assert knee is not None
    target = scaling_target(knee, replicas=1, group="gpu", max_concurrency=16)
    assert (target.utilisation, target.capped) == (1.0, True)
