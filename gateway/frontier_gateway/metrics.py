"""The gateway's own Prometheus metrics, per tenant and model, and each replica's state."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from frontier_gateway import contracts as c
from frontier_gateway.pools import Pools

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class _ReplicaCollector(Collector):
    def __init__(self, pools: Pools) -> None:
        self.pools = pools

    def collect(self):  # type: ignore[no-untyped-def]
        ready = GaugeMetricFamily(
            c.REPLICA_READY_METRIC,
            "1 while the replica answers its readiness probe",
            labels=[c.MODEL_LABEL, "replica"],
        )
        outstanding = GaugeMetricFamily(
            c.REPLICA_OUTSTANDING_METRIC,
            "requests the gateway has open on the replica",
            labels=[c.MODEL_LABEL, "replica"],
        )
        for name, pool in self.pools.by_model.items():
            for replica in pool.replicas:
                ready.add_metric([name, replica.url], float(replica.ready))
                outstanding.add_metric([name, replica.url], float(replica.outstanding))
        yield ready
        yield outstanding


class Metrics:
    def __init__(self, pools: Pools) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        tm = [c.TENANT_LABEL, c.MODEL_LABEL]
        self.requests = Counter(c.REQUESTS_METRIC, "answered requests by status", [*tm, "status"], registry=r)
        self.duration = Histogram(
            c.DURATION_METRIC,
            "time from arrival to the end of the answer",
            tm,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            c.TTFT_METRIC,
            "time from arrival to the first streamed token",
            tm,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(c.TOKENS_METRIC, "tokens from the runtime's usage", [*tm, "kind"], registry=r)
        self.rate_limited = Counter(
            c.RATE_LIMITED_METRIC, "requests refused by a tenant quota", [c.TENANT_LABEL, "limit"], registry=r
        )
        self.in_flight = Gauge(
            c.IN_FLIGHT_METRIC, "requests in flight per tenant", [c.TENANT_LABEL], registry=r
        )
        self.retries = Counter(
            c.RETRIES_METRIC, "requests sent again to another replica", [c.MODEL_LABEL], registry=r
        )
        r.register(_ReplicaCollector(pools))

    def render(self) -> bytes:
        return generate_latest(self.registry)
