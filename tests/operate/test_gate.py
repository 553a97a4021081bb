"""The gate reads error rate and p99 from two scrapes of a host's /metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from frontier.config.schema import Gate
from frontier.hosts.inventory import HostSpec
from frontier.rollout.gate import GateReading, judge, quantile, read_gate
from frontier.rollout.rolling import waves

HEALTH = {"/health/ready", "/health/live", "/metrics"}
GATE = Gate(window_s=1, max_error_rate=0.05, max_p99_latency_ms=1000, min_requests=10)


class Runtime:
    """The runtime's gate metrics, under the names it exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("frontier_http_requests", "", ["route", "status"], registry=self.registry)
        self.duration = Histogram(
            "frontier_http_request_duration_seconds", "", ["route"], registry=self.registry,
            buckets=(0.1, 0.5, 1.0, 2.5, 5.0),
        )  # fmt: skip

    def serve(self, route: str, status: int, seconds: float, n: int = 1) -> None:
        for _ in range(n):
            self.requests.labels(route, str(status)).inc()
            self.duration.labels(route).observe(seconds)

    def scrape(self) -> str:
        return generate_latest(self.registry).decode()


def test_only_requests_served_inside_the_window_count():
    rt = Runtime()
    rt.serve("/v1/completions", 500, 0.05, n=50)  # before the window
    before = rt.scrape()
    rt.serve("/v1/completions", 200, 0.05, n=97)
    rt.serve("/v1/completions", 503, 0.05, n=3)
    rt.serve("/health/ready", 503, 0.01, n=40)  # health checks are not traffic

    reading = read_gate(before, rt.scrape(), HEALTH)
    assert reading.requests == 100 and reading.errors == 3 and reading.error_rate == pytest.approx(0.03)
    assert judge(reading, GATE) is None


def test_an_error_rate_over_the_threshold_fails_the_gate():
    rt = Runtime()
    before = rt.scrape()
    rt.serve("/v1/chat/completions", 200, 0.05, n=90)
    rt.serve("/v1/chat/completions", 500, 0.05, n=10)
    assert "error rate 10.00% > rollout.gate.max_error_rate" in judge(
        read_gate(before, rt.scrape(), HEALTH), GATE
    )


def test_a_p99_over_the_threshold_fails_the_gate():
    rt = Runtime()
    before = rt.scrape()
    rt.serve("/v1/completions", 200, 0.05, n=95)
    rt.serve("/v1/completions", 200, 4.0, n=5)
    reading = read_gate(before, rt.scrape(), HEALTH)
    assert reading.p99_s == pytest.approx(4.5)  # the 99th of 100 lies 80% into the 2.5-5 s bucket
    assert "p99 4500 ms > rollout.gate.max_p99_latency_ms" in judge(reading, GATE)


def test_too_little_traffic_fails_a_gate_that_requires_some():
    assert "min_requests is 10" in judge(GateReading(requests=3, errors=0, p99_s=0.1), GATE)
    assert judge(GateReading(0, 0, None), GATE.model_copy(update={"min_requests": 0})) is None


def test_quantile_interpolates_inside_the_bucket_like_prometheus():
    assert quantile(0.5, {1.0: 10, 2.0: 20, float("inf"): 20}) == pytest.approx(1.0)
    assert quantile(0.75, {1.0: 10, 2.0: 20, float("inf"): 20}) == pytest.approx(1.5)
    assert quantile(0.99, {}) is None


def test_the_canary_goes_first_then_batches():
    hosts = [HostSpec(f"h{i}", f"10.0.0.{i}", 22, "/opt/frontier", "g") for i in range(1, 7)]
    plan = [(name, [h.name for h in wave]) for name, wave in waves(hosts, canary=1, batch=2)]
    assert plan == [
        ("canary", ["h1"]),
        ("batch 1", ["h2", "h3"]),
        ("batch 2", ["h4", "h5"]),
        ("batch 3", ["h6"]),
    ]
