"""The metric gate: a host's request error rate and p99 latency over a window, from its /metrics.

Two scrapes of the runtime's Prometheus text, before and after the window, give the requests and
latency histogram of that window alone; health and metrics routes are left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from frontier_hostside import names
from prometheus_client.parser import text_string_to_metric_families

from frontier.config.schema import Gate

REQUESTS_METRIC = names.HTTP_REQUESTS_METRIC
DURATION_METRIC = names.HTTP_DURATION_METRIC


@dataclass(frozen=True)
class GateReading:
    requests: float
    errors: float
    p99_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def describe(self) -> str:
        p99 = "n/a" if self.p99_s is None else f"{self.p99_s * 1000:.0f} ms"
        return f"{self.requests:.0f} requests, error rate {self.error_rate:.2%}, p99 {p99}"


def _samples(text: str, excluded_routes: set[str]) -> tuple[dict[tuple[str, str], float], dict[float, float]]:
    """Request counts by (route, status) and latency bucket counts by upper bound, for served routes."""
    requests: dict[tuple[str, str], float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            route = sample.labels.get("route", "")
            if route in excluded_routes:
                continue
            if sample.name == f"{REQUESTS_METRIC}_total":
                key = (route, sample.labels.get("status", ""))
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == f"{DURATION_METRIC}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return requests, buckets


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts (linear inside a bucket)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return bounds[-1]


def read_gate(before: str, after: str, excluded_routes: set[str]) -> GateReading:
    """Requests, server errors (5xx) and p99 latency served between two scrapes of /metrics."""
    return read_series({"": before}, {"": after}, excluded_routes)


def read_series(
    before: Mapping[str, str], after: Mapping[str, str], excluded_routes: set[str]
) -> GateReading:
    """One release's series over several hosts: their requests, errors and latency histograms summed
    between two scrapes of each (``before`` and ``after`` by host name), so the p99 is the release's,
    not an average of its hosts'."""
    requests: dict[tuple[str, str], float] = {}
    window: dict[float, float] = {}
    for host, text in after.items():
        req0, b0 = _samples(before[host], excluded_routes)
        req1, b1 = _samples(text, excluded_routes)
        for key, value in req1.items():
            requests[key] = requests.get(key, 0.0) + max(0.0, value - req0.get(key, 0.0))
        for le, count in b1.items():
            window[le] = window.get(le, 0.0) + max(0.0, count - b0.get(le, 0.0))
    total = sum(requests.values())
    errors = sum(v for (_, status), v in requests.items() if status[:1] == "5")
    return GateReading(total, errors, quantile(0.99, window))


def judge(reading: GateReading, gate: Gate) -> str | None:
    """None when the reading passes the stack's gate, else why it does not."""
    if reading.requests < gate.min_requests:
        return f"only {reading.requests:.0f} requests in the window; rollout.gate.min_requests is {gate.min_requests}"
    if reading.requests and reading.error_rate > gate.max_error_rate:
        return f"error rate {reading.error_rate:.2%} > rollout.gate.max_error_rate {gate.max_error_rate:.2%} ({reading.describe()})"
    if reading.p99_s is not None and reading.p99_s * 1000 > gate.max_p99_latency_ms:
        return f"p99 {reading.p99_s * 1000:.0f} ms > rollout.gate.max_p99_latency_ms {gate.max_p99_latency_ms:.0f} ({reading.describe()})"
    return None


def judge_relative(reading: GateReading, old: GateReading, gate: Gate) -> str | None:
    """None when the canary's p99 is within ``rollout.gate.max_p99_ratio`` of the old release's over
    the same window (or either has too few requests to say), else why not."""
    ratio = gate.max_p99_ratio
    if ratio is None or reading.p99_s is None or old.p99_s is None or old.requests < gate.min_requests:
        return None
    if reading.p99_s > ratio * old.p99_s:
        return (
            f"p99 {reading.p99_s * 1000:.0f} ms > rollout.gate.max_p99_ratio {ratio:g} x the old release's "
            f"{old.p99_s * 1000:.0f} ms over the same window ({reading.describe()})"
        )
    return None
