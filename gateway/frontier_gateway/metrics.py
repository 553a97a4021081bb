"""The gateway's own Prometheus metrics, per tenant and model, and each replica's state.

Served on the admin port only: they name tenants, their volumes and the replicas' addresses."""

from __future__ import annotations

from frontier_hostside import names
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from frontier_gateway.hold import POOL_LABEL, POOL_WAITING_METRIC
from frontier_gateway.pools import Pools

# The exposition format's media type, which the app's /metrics answers with.
CONTENT_TYPE = CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


def _per_replica(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    """A gauge with a sample per replica of each pool: by model, replica address and ``labels``."""
    return GaugeMetricFamily(name, doc, labels=[names.GATEWAY_MODEL_LABEL, "replica", *labels])


class _ReplicaCollector(Collector):
    def __init__(self, pools: Pools) -> None:
        self.pools = pools

    def collect(self):  # type: ignore[no-untyped-def]
        ready = _per_replica(
            names.GATEWAY_REPLICA_READY_METRIC, "1 while the replica answers its readiness probe"
        )
        outstanding = _per_replica(
            names.GATEWAY_REPLICA_OUTSTANDING_METRIC, "requests the gateway has open on the replica"
        )
        breaker = _per_replica(
            names.GATEWAY_REPLICA_BREAKER_METRIC,
            "1 while the replica's circuit breaker keeps it out of rotation (open, or half-open "
            "with its trial request out)",
            "replica_id",
        )
        for name, pool in self.pools.by_model.items():
            for replica in pool.replicas:
                ready.add_metric([name, replica.url], float(replica.ready))
                outstanding.add_metric([name, replica.url], float(replica.outstanding))
                # replica_id is what clients see in x-frontier-replica: this maps it to the address.
                breaker.add_metric([name, replica.url, replica.id], float(not replica.breaker.available()))
        yield ready
        yield outstanding
        yield breaker
        # KV-aware routing: decisions by outcome (events_stopped: load only, the replicas' events
        # went quiet), and the blocks indexed per replica.
        kv_decisions = CounterMetricFamily(
            names.GATEWAY_KV_ROUTING_METRIC,
            "routing decisions of pools with KV routing, by outcome",
            labels=[names.GATEWAY_MODEL_LABEL, "outcome"],
        )
        kv_blocks = _per_replica(
            names.GATEWAY_KV_BLOCKS_METRIC, "cached blocks the KV index holds for the replica"
        )
        for name, pool in self.pools.by_model.items():
            if pool.kv is not None:
                for outcome, count in pool.kv.index.outcomes.items():
                    kv_decisions.add_metric([name, outcome], float(count))
                for url, blocks in pool.kv.index.summary().items():
                    kv_blocks.add_metric([name, url], float(blocks))
        yield kv_decisions
        yield kv_blocks
        # The demand signal of a pool that may be at zero: what the autoscalers launch a replica on.
        waiting = GaugeMetricFamily(
            POOL_WAITING_METRIC,
            "requests held waiting for a replica of the pool to become ready",
            labels=[POOL_LABEL],
        )
        for name, pool in self.pools.by_model.items():
            if pool.hold is not None:
                waiting.add_metric([name], float(pool.hold.waiting))
        yield waiting


class Metrics:
    def __init__(self, pools: Pools) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        tm = [names.TENANT_LABEL, names.GATEWAY_MODEL_LABEL]
        model = [names.GATEWAY_MODEL_LABEL]

        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def latency(name: str, doc: str, labels: list[str]) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=r)

        self.requests = counter(names.GATEWAY_REQUESTS_METRIC, "answered requests by status", [*tm, "status"])
        self.duration = latency(
            names.GATEWAY_DURATION_METRIC, "time from arrival to the end of the answer", tm
        )
        self.ttft = latency(names.GATEWAY_TTFT_METRIC, "time from arrival to the first streamed token", tm)
        self.tokens = counter(names.GATEWAY_TOKENS_METRIC, "tokens from the runtime's usage", [*tm, "kind"])
        self.rate_limited = counter(
            names.GATEWAY_RATE_LIMITED_METRIC,
            "requests refused by a tenant quota",
            [names.TENANT_LABEL, "limit"],
        )
        self.in_flight = Gauge(
            names.GATEWAY_IN_FLIGHT_METRIC, "requests in flight per tenant", [names.TENANT_LABEL], registry=r
        )
        self.retries = counter(names.GATEWAY_RETRIES_METRIC, "requests sent again to another replica", model)
        self.migrations = counter(
            names.GATEWAY_MIGRATIONS_METRIC,
            "generations moved to another replica mid-answer, by why (died, error, aborted, interrupted)",
            [*model, "reason"],
        )
        self.migration_stall = latency(
            names.GATEWAY_MIGRATION_STALL_METRIC,
            "time a migrated generation's client waited: from the failure to the continuation's first chunk",
            model,
        )
        self.migration_failures = counter(
            names.GATEWAY_MIGRATION_FAILURES_METRIC,
            "generations that could not be moved (limit, no_replica, refused, hold_timeout, hold_queue_full): "
            "they end with an error event",
            [*model, "why"],
        )
        r.register(_ReplicaCollector(pools))

    def render(self) -> bytes:
        return generate_latest(self.registry)
